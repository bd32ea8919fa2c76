//! Helpers of the end-to-end suite: find the workspace's built binaries and
//! run them, capturing what a user would see; the Cora fixtures that several
//! test files share; the servers and file systems some tests need, and how a
//! test that cannot have one says it was skipped ([`skip`]); and the
//! readiness waits a test signals or kills a program after.

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The workspace root.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ lives in the workspace")
        .to_path_buf()
}

/// Path of a workspace binary (or the Python extension) built by `cargo build --workspace`
/// (scripts/test builds them first), from the profile this test runs under.
pub fn binary(name: &str) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target"));
    // Tests run from target/<profile>/deps/; the binaries sit one level up.
    let exe = std::env::current_exe().expect("test executable path");
    let from_exe = exe
        .parent()
        .and_then(Path::parent)
        .map(|dir| dir.join(name));
    let candidates = from_exe.into_iter().chain([
        target.join("debug").join(name),
        target.join("release").join(name),
    ]);
    for path in candidates {
        if path.exists() {
            return path;
        }
    }
    panic!("binary '{name}' is not built: run `cargo build --workspace` (scripts/test does)");
}

/// The outcome of one run of a binary.
pub struct Run {
    pub status: std::process::ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// The JSON summary: the last line of stdout.
    pub fn json(&self) -> serde_json::Value {
        let line = self.stdout.lines().last().unwrap_or_default();
        serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("last stdout line is not JSON ({e}): {line}"))
    }
}

/// Asserts that `r` failed with exactly one line on stderr, and that the
/// line says `want`: how every program refuses bad input.
pub fn assert_one_line(r: &Run, want: &str) {
    assert!(!r.status.success(), "expected a failure mentioning {want}");
    assert!(r.stderr.contains(want), "{want}: {}", r.stderr);
    assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr);
}

/// Runs a workspace binary with `args`.
pub fn run(name: &str, args: &[&str]) -> Run {
    run_with_env(name, args, &[])
}

/// Trains a small model (one epoch of two batches, 64 hidden channels)
/// from the layout at `manifest` and exports it to `export`, for the tests
/// that need a model, not a trained one.
pub fn export_small_model(manifest: &Path, export: &Path) {
    let r = run(
        "trainer",
        &[
            "--manifest",
            manifest.to_str().expect("a UTF-8 path"),
            "--epochs",
            "1",
            "--hidden",
            "64",
            "--max-batches",
            "2",
            "--export",
            export.to_str().expect("a UTF-8 path"),
        ],
    );
    assert!(r.status.success(), "{}", r.stderr);
}

/// Runs a workspace binary with `args` and extra environment variables.
pub fn run_with_env(name: &str, args: &[&str], env: &[(&str, &str)]) -> Run {
    let Output {
        status,
        stdout,
        stderr,
    } = Command::new(binary(name))
        .args(args)
        .env("RUST_LOG", "warn")
        .envs(env.iter().copied())
        .output()
        .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
    Run {
        status,
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    }
}

/// Writes a synthetic dataset at `dir/g` with `sampler generate` and these
/// flags, failing the test if that fails; returns its directory.
pub fn generate(dir: &Path, flags: &[&str]) -> PathBuf {
    let ds = dir.join("g");
    let mut args = vec!["generate", "--out", ds.to_str().expect("a UTF-8 path")];
    args.extend_from_slice(flags);
    let r = run("sampler", &args);
    assert!(r.status.success(), "sampler generate: {}", r.stderr);
    ds
}

/// Runs a workspace binary under `/usr/bin/time` (scripts/setup installs
/// it) and returns the run and its peak resident memory in bytes. The
/// time line is taken off stderr.
pub fn run_peak(name: &str, args: &[&str]) -> (Run, u64) {
    let time = Path::new("/usr/bin/time");
    assert!(
        time.exists(),
        "/usr/bin/time is missing: scripts/setup installs it"
    );
    let Output {
        status,
        stdout,
        stderr,
    } = Command::new(time)
        .args(["-f", "offgnn_peak_kb=%M"])
        .arg(binary(name))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
    let stderr = String::from_utf8_lossy(&stderr);
    let mut peak_kb = None;
    let mut rest = String::new();
    for line in stderr.lines() {
        match line.strip_prefix("offgnn_peak_kb=") {
            Some(v) => peak_kb = v.trim().parse::<u64>().ok(),
            // time's own note of a failing exit.
            None if line.starts_with("Command exited with non-zero status") => {}
            None => {
                rest.push_str(line);
                rest.push('\n');
            }
        }
    }
    let peak_kb = peak_kb.unwrap_or_else(|| panic!("no peak from /usr/bin/time in {stderr}"));
    let run = Run {
        status,
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: rest,
    };
    (run, peak_kb * 1024)
}

/// A loopback port nothing listens on now.
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    l.local_addr().expect("its address").port()
}

/// tests/support/http_range_server.py serving `dir` on a free loopback
/// port (an object host with byte ranges): the running server and its
/// port. Kill it when done.
pub fn http_server(dir: &Path) -> (std::process::Child, u16) {
    use std::io::BufRead;
    let mut server = Command::new("python3")
        .arg(workspace().join("tests/support/http_range_server.py"))
        .current_dir(dir)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 starts");
    let mut line = String::new();
    std::io::BufReader::new(server.stdout.take().expect("piped"))
        .read_line(&mut line)
        .expect("the server says its port");
    let port = line
        .trim()
        .strip_prefix("port ")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("the server says its port, not {line:?}"));
    (server, port)
}

/// A WebDAV server (wsgidav, which scripts/setup installs into .venv)
/// serving `dir` to anyone on a free loopback port: the running server and
/// its port, once it accepts connections. Kill it when done.
pub fn webdav_server(dir: &Path) -> (std::process::Child, u16) {
    let bin = workspace().join(".venv/bin/wsgidav");
    assert!(
        bin.exists(),
        "{} is missing: run scripts/setup",
        bin.display()
    );
    let port = free_port();
    let mut server = Command::new(&bin)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--auth", "anonymous", "--no-config", "-q", "--root"])
        .arg(dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("wsgidav starts");
    let deadline = std::time::Instant::now() + READY_TIMEOUT;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Some(status) = server.try_wait().expect("the server's status") {
            panic!("wsgidav ended before it listened on port {port}: {status}");
        }
        assert!(
            std::time::Instant::now() < deadline,
            "wsgidav did not listen on port {port} within {READY_TIMEOUT:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    (server, port)
}

/// The Cora tables fetched by scripts/setup.
pub fn cora_dir() -> PathBuf {
    let dir = std::env::var_os("OFFGNN_CORA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join(".cache/cora"));
    assert!(
        dir.join("cora_nodes.parquet.gzip").exists(),
        "the Cora tables are missing from {}: run scripts/setup",
        dir.display()
    );
    dir
}

/// The packer flags of the Cora tests: 1M and 2M caches, an 8x disk budget.
pub fn cora_pack_args<'a>(samples: &'a str, features: &'a str, out: &'a str) -> Vec<&'a str> {
    vec![
        "--samples",
        samples,
        "--features",
        features,
        "--out",
        out,
        "--gpu-cache",
        "1M",
        "--cpu-cache",
        "2M",
        "--disk-budget",
        "8x",
    ]
}

/// Imports the Cora tables into `out` with `extra` flags.
pub fn import_cora(out: &Path, extra: &[&str]) {
    let cora = cora_dir();
    let nodes = cora.join("cora_nodes.parquet.gzip");
    let edges = cora.join("cora_rels.parquet.gzip");
    let mut args = vec![
        "import-parquet",
        "--preset",
        "cora",
        "--nodes",
        nodes.to_str().unwrap(),
        "--edges",
        edges.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let r = run("sampler", &args);
    assert!(r.status.success(), "{}", r.stderr);
}

/// `sampler split-edges` of the dataset at `ds` into `out` with `flags`.
pub fn split_edges(ds: &Path, out: &Path, flags: &[&str]) -> Run {
    let mut args = vec![
        "split-edges",
        "--dataset",
        ds.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(flags);
    run("sampler", &args)
}

/// Samples the dataset at `ds` into `out` with `flags`, and checks that it
/// succeeded.
pub fn sample(ds: &Path, out: &Path, flags: &[&str]) {
    let mut args = vec![
        "--dataset",
        ds.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(flags);
    let r = run("sampler", &args);
    assert!(r.status.success(), "{}", r.stderr);
}

/// Packs `samples` with `ds`'s features into `out` with `flags`, checks
/// that it succeeded, and returns the manifest's path.
pub fn pack(ds: &Path, samples: &Path, out: &Path, flags: &[&str]) -> PathBuf {
    let features = ds.join("data/feat.npy");
    let mut args = vec![
        "--samples",
        samples.to_str().unwrap(),
        "--features",
        features.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(flags);
    let r = run("packer", &args);
    assert!(r.status.success(), "{}", r.stderr);
    out.join("manifest.json")
}

/// Imports Cora and samples it into `dir`; returns (dataset, samples).
pub fn cora_samples(dir: &Path) -> (PathBuf, PathBuf) {
    let ds = dir.join("cora");
    import_cora(&ds, &[]);
    let samples = dir.join("samples");
    let r = run(
        "sampler",
        &[
            "--dataset",
            ds.to_str().unwrap(),
            "--out",
            samples.to_str().unwrap(),
            "--batch-size",
            "256",
            "--epochs",
            "2",
        ],
    );
    assert!(r.status.success(), "{}", r.stderr);
    (ds, samples)
}

/// Imports, samples and packs Cora into `dir`; returns the manifest path.
pub fn cora_pack(dir: &Path) -> PathBuf {
    let (ds, samples) = cora_samples(dir);
    let out = dir.join("pack");
    let feat = ds.join("data/feat.npy");
    let r = run(
        "packer",
        &cora_pack_args(
            samples.to_str().unwrap(),
            feat.to_str().unwrap(),
            out.to_str().unwrap(),
        ),
    );
    assert!(r.status.success(), "{}", r.stderr);
    out.join("manifest.json")
}

/// The S3-compatible server `scripts/test` starts (see `scripts/s3-server`),
/// read from the environment it exports.
pub struct S3 {
    pub endpoint: String,
    pub bucket: String,
    pub access_key: String,
    pub secret_key: String,
    /// Where the server keeps its objects: `root/bucket/key`.
    pub root: PathBuf,
    /// The server binary, to start private instances.
    pub bin: PathBuf,
}

impl S3 {
    /// The server, or `None` when none runs: the test is then [`skip`]ped
    /// (a failure under `OFFGNN_REQUIRE_S3=1`, as `scripts/test` sets).
    pub fn from_env() -> Option<S3> {
        let var = |k: &str| std::env::var(k).ok();
        let Some(endpoint) = var("OFFGNN_S3_ENDPOINT") else {
            skip(Need::S3, "no S3 server: OFFGNN_S3_ENDPOINT is unset");
            return None;
        };
        Some(S3 {
            endpoint,
            bucket: var("OFFGNN_S3_BUCKET").unwrap_or_else(|| "offgnn".into()),
            access_key: var("OFFGNN_S3_ACCESS_KEY").unwrap_or_default(),
            secret_key: var("OFFGNN_S3_SECRET_KEY").unwrap_or_default(),
            root: var("OFFGNN_S3S_ROOT")
                .map(PathBuf::from)
                .unwrap_or_default(),
            bin: var("OFFGNN_S3S_BIN").map(PathBuf::from).unwrap_or_default(),
        })
    }

    /// `s3://bucket/key`.
    pub fn url(&self, key: &str) -> String {
        format!("s3://{}/{key}", self.bucket)
    }

    /// The variables a program needs to reach this server.
    pub fn env(&self) -> Vec<(String, String)> {
        s3_env(&self.endpoint, &self.access_key, &self.secret_key)
    }

    /// The store at `s3://bucket/key`, opened in this process.
    pub fn store(&self, key: &str) -> offgnn_shared::store::Store {
        let env = self.env();
        let settings: Vec<(&str, &str)> =
            env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        offgnn_shared::store::Store::open_with(&self.url(key), &settings)
            .expect("opening the test server's bucket")
    }
}

fn s3_env(endpoint: &str, access_key: &str, secret_key: &str) -> Vec<(String, String)> {
    [
        ("AWS_ENDPOINT", endpoint),
        ("AWS_ALLOW_HTTP", "true"),
        ("AWS_ACCESS_KEY_ID", access_key),
        ("AWS_SECRET_ACCESS_KEY", secret_key),
        ("AWS_REGION", "us-east-1"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// A private s3s-fs instance on its own port and data directory, which a
/// test can kill and start again (same port, same objects).
pub struct S3Server {
    bin: PathBuf,
    pub root: tempfile::TempDir,
    pub bucket: String,
    port: u16,
    child: Option<std::process::Child>,
}

impl S3Server {
    /// Starts one with an empty bucket `bucket`.
    pub fn start(bin: &Path, bucket: &str) -> S3Server {
        let root = tempfile::tempdir().expect("a data directory");
        std::fs::create_dir_all(root.path().join(bucket)).expect("the bucket directory");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let mut server = S3Server {
            bin: bin.to_path_buf(),
            root,
            bucket: bucket.to_string(),
            port,
            child: None,
        };
        server.restart();
        server
    }

    /// Kills the server (SIGKILL): connections drop, nothing is flushed.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server (again) on the same port and data, and waits until
    /// it accepts connections.
    pub fn restart(&mut self) {
        self.kill();
        let child = Command::new(&self.bin)
            .args(["--host", "127.0.0.1", "--port", &self.port.to_string()])
            .args([
                "--access-key",
                "offgnn-test",
                "--secret-key",
                "offgnn-test-secret",
            ])
            .arg(self.root.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.bin.display()));
        self.child = Some(child);
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], self.port));
        for _ in 0..200 {
            if std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_millis(100))
                .is_ok()
            {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(25));
        }
        panic!("s3s-fs did not start listening on port {}", self.port);
    }

    pub fn url(&self, key: &str) -> String {
        format!("s3://{}/{key}", self.bucket)
    }

    pub fn env(&self) -> Vec<(String, String)> {
        s3_env(
            &format!("http://127.0.0.1:{}", self.port),
            "offgnn-test",
            "offgnn-test-secret",
        )
    }

    /// Whether an object exists (the server keeps `root/bucket/key`).
    pub fn has(&self, key: &str) -> bool {
        self.root.path().join(&self.bucket).join(key).exists()
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs a workspace binary with extra environment variables given as owned
/// pairs (as [`S3::env`] returns them).
pub fn run_env(name: &str, args: &[&str], env: &[(String, String)]) -> Run {
    let pairs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    run_with_env(name, args, &pairs)
}

/// The name of the first segment object of the layout whose manifest is at
/// `manifest` (each packer run names its objects under its own run id).
pub fn first_segment(manifest: &Path) -> String {
    let m: offgnn_manifests::Manifest = serde_json::from_slice(
        &std::fs::read(manifest).unwrap_or_else(|e| panic!("{}: {e}", manifest.display())),
    )
    .expect("a manifest");
    m.segments[0].object.clone()
}

/// A tmpfs of a given size, mounted on a fresh temporary directory for a
/// test of a full disk; unmounted when dropped. `None` where mounting is
/// not permitted: the test is then [`skip`]ped (a failure under
/// `OFFGNN_REQUIRE_MOUNT=1`, as `scripts/test` sets).
pub struct SmallFs {
    pub dir: tempfile::TempDir,
}

impl SmallFs {
    pub fn mount(bytes: u64) -> Option<SmallFs> {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(dir.path())
            .output();
        match mounted {
            Ok(o) if o.status.success() => Some(SmallFs { dir }),
            Ok(o) => {
                let why = String::from_utf8_lossy(&o.stderr);
                skip(
                    Need::Mount,
                    &format!("cannot mount a tmpfs: {}", why.trim()),
                );
                None
            }
            Err(e) => {
                skip(Need::Mount, &format!("cannot run mount: {e}"));
                None
            }
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

/// What an end-to-end test needs that a machine may lack. `scripts/test`
/// provides each one and sets its `OFFGNN_REQUIRE_*` variable to 1.
#[derive(Clone, Copy, Debug)]
pub enum Need {
    /// An S3-compatible server (`scripts/s3-server`).
    S3,
    /// Rights to mount a tmpfs (root).
    Mount,
    /// A Slurm controller (`scripts/slurm-local`).
    Slurm,
}

impl Need {
    /// The variable that makes a missing need a failure.
    pub fn require_var(self) -> &'static str {
        match self {
            Need::S3 => "OFFGNN_REQUIRE_S3",
            Need::Mount => "OFFGNN_REQUIRE_MOUNT",
            Need::Slurm => "OFFGNN_REQUIRE_SLURM",
        }
    }

    /// How to provide it.
    fn remedy(self) -> &'static str {
        match self {
            Need::S3 => "source scripts/s3-server",
            Need::Mount => "run the tests as root",
            Need::Slurm => "run scripts/slurm-local",
        }
    }
}

/// The test running now cannot run here, for want of `need` (`why` says
/// what is missing); its caller returns at once. Under the need's
/// `OFFGNN_REQUIRE_*=1` this fails the test. Otherwise it writes one line,
/// `SKIPPED: <test> (<why>; ...)`, to stderr past libtest's capture (so it
/// shows beside the test's `ok`: stable libtest has no skipped outcome
/// decided at run time), and `scripts/test` counts those lines.
pub fn skip(need: Need, why: &str) {
    let test = std::thread::current()
        .name()
        .unwrap_or("an end-to-end test")
        .to_string();
    let var = need.require_var();
    assert!(
        std::env::var(var).as_deref() != Ok("1"),
        "{var}=1 but {test} cannot run: {why} ({})",
        need.remedy()
    );
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED: {test} ({why}; {} to run it, {var}=1 to fail instead)",
        need.remedy()
    );
}

/// How long a test waits for a program to reach the stage it tests.
pub const READY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// Waits until `ready` says that `child`, a run of `program`, has reached
/// `stage` (a file it writes, a line it prints): the readiness signal a
/// test waits on before it signals or kills the child, rather than a fixed
/// sleep. Fails the test, naming the stage, when the child ends first
/// (with its stderr, where piped: the workload is too small to catch it
/// there) or after [`READY_TIMEOUT`].
pub fn wait_until_ready(
    child: &mut std::process::Child,
    program: &str,
    stage: &str,
    ready: &dyn Fn() -> bool,
) {
    let started = std::time::Instant::now();
    while !ready() {
        if let Some(status) = child.try_wait().expect("the child's status") {
            let mut stderr = String::new();
            if let Some(mut pipe) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
            }
            panic!(
                "{program} ended ({status}) {:.2} s after it started, before {stage}: give it more work\n{stderr}",
                started.elapsed().as_secs_f64()
            );
        }
        if started.elapsed() > READY_TIMEOUT {
            let _ = child.kill();
            panic!("{program} did not reach {stage} within {READY_TIMEOUT:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Every file under `dir`, relative and sorted (none when it is absent).
pub fn files_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else {
                out.push(
                    p.strip_prefix(dir)
                        .expect("under dir")
                        .display()
                        .to_string(),
                );
            }
        }
    }
    out.sort();
    out
}

/// The budgets and policy [`typed_pack`] packs with.
pub const TYPED_PACK_FLAGS: [&str; 8] = [
    "--gpu-cache",
    "8K",
    "--cpu-cache",
    "16K",
    "--disk-budget",
    "10x",
    "--cpu-cache-policy",
    "static",
];

/// A small typed graph of IGBH's schema (3000 papers; every type with
/// features), sampled for 2 epochs at fan-out 5,3 and packed; the layout's
/// directory.
pub fn typed_pack(dir: &Path) -> PathBuf {
    let ds = generate(
        dir,
        &[
            "--schema",
            "igbh",
            "--nodes",
            "3000",
            "--feature-dim",
            "16",
            "--type-dims",
            "author=8,fos=4,institute=4",
            "--classes",
            "4",
        ],
    );
    let samples = dir.join("samples");
    let flags = ["--fanout", "5,3", "--batch-size", "128", "--epochs", "2"];
    sample(&ds, &samples, &flags);
    let out = dir.join("pack");
    let mut args = vec![
        "--samples",
        samples.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend(TYPED_PACK_FLAGS);
    let r = run("packer", &args);
    assert!(r.status.success(), "packer: {}", r.stderr);
    out
}

/// A generated graph of 3000 nodes whose classes show in its features and
/// edges, split for link prediction (20 negatives per held-out edge) into
/// `dir/lp`, sampled with 3 negatives per training pair and packed; returns
/// the manifest.
pub fn link_pack(dir: &Path) -> PathBuf {
    let ds = generate(
        dir,
        &[
            "--nodes",
            "3000",
            "--feature-dim",
            "32",
            "--classes",
            "8",
            "--signal",
            "1.0",
        ],
    );
    let lp = dir.join("lp");
    let (d, o) = (ds.to_str().unwrap(), lp.to_str().unwrap());
    let r = run(
        "sampler",
        &[
            "split-edges",
            "--dataset",
            d,
            "--out",
            o,
            "--negatives",
            "20",
        ],
    );
    assert!(r.status.success(), "{}", r.stderr);
    let samples = dir.join("samples");
    let flags = ["--task", "link", "--negatives", "3", "--fanout", "5,5"];
    let mut flags = flags.to_vec();
    flags.extend_from_slice(&["--batch-size", "128", "--epochs", "2"]);
    sample(&lp, &samples, &flags);
    let flags = [
        "--gpu-cache",
        "16K",
        "--cpu-cache",
        "16K",
        "--disk-budget",
        "30x",
    ];
    pack(&lp, &samples, &dir.join("pack"), &flags)
}
