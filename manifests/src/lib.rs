//! The packed-layout manifest: its format version and the rule for reading
//! one. The packer writes `manifest.json` last, as the commit point of a
//! layout; the trainer reads nothing a manifest does not name. The full
//! schema (objects, tiers, address tables) grows with the packer; what is
//! fixed from the start is that every manifest carries `format_version`, and
//! a reader refuses versions it does not know instead of misreading them.

use serde::Deserialize;

/// The manifest format this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{origin}: not a manifest: {reason}")]
    Malformed { origin: String, reason: String },
    #[error(
        "{origin}: manifest format version {found} is newer than this build understands (up to {FORMAT_VERSION}); upgrade offgnn"
    )]
    FutureVersion { origin: String, found: u32 },
    #[error(
        "{origin}: manifest format version {found} is not supported (this build reads {FORMAT_VERSION})"
    )]
    UnsupportedVersion { origin: String, found: u32 },
}

#[derive(Deserialize)]
struct VersionProbe {
    format_version: u32,
}

/// Reads only `format_version` from a manifest's bytes and checks that this
/// build can read the rest. `origin` names the manifest in errors.
pub fn check_version(origin: &str, bytes: &[u8]) -> Result<u32, Error> {
    let probe: VersionProbe = serde_json::from_slice(bytes).map_err(|e| Error::Malformed {
        origin: origin.to_string(),
        reason: e.to_string(),
    })?;
    match probe.format_version {
        FORMAT_VERSION => Ok(FORMAT_VERSION),
        v if v > FORMAT_VERSION => Err(Error::FutureVersion {
            origin: origin.to_string(),
            found: v,
        }),
        v => Err(Error::UnsupportedVersion {
            origin: origin.to_string(),
            found: v,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_current_version() {
        let doc = format!(r#"{{"format_version": {FORMAT_VERSION}, "other": 1}}"#);
        assert_eq!(
            check_version("m.json", doc.as_bytes()).unwrap(),
            FORMAT_VERSION
        );
    }

    #[test]
    fn refuses_a_future_version_by_name() {
        let doc = format!(r#"{{"format_version": {}}}"#, FORMAT_VERSION + 1);
        let err = check_version("s3://b/m.json", doc.as_bytes()).unwrap_err();
        assert!(matches!(err, Error::FutureVersion { .. }));
        assert!(err.to_string().contains("s3://b/m.json"), "{err}");
        assert!(err.to_string().contains("upgrade"), "{err}");
    }

    #[test]
    fn refuses_documents_without_a_version() {
        let err = check_version("m.json", b"{}").unwrap_err();
        assert!(matches!(err, Error::Malformed { .. }), "{err}");
        let err = check_version("m.json", b"not json").unwrap_err();
        assert!(matches!(err, Error::Malformed { .. }), "{err}");
    }
}
