//! Every program's `--help`: a user's first look shows a worked example.

use offgnn_e2e::run;

#[test]
fn every_binary_has_help_with_a_worked_example() {
    for name in ["sampler", "packer", "trainer"] {
        let r = run(name, &["--help"]);
        assert!(r.status.success(), "{name} --help failed: {}", r.stderr);
        assert!(
            r.stdout.contains("Examples:"),
            "{name} --help shows no example"
        );
        assert!(
            r.stdout.contains(&format!("  {name} ")),
            "{name}'s examples do not run {name}"
        );
    }
}
