//! The HTTP store's client, with one change to object_store's: a server
//! that answers a method with 501 Not Implemented or 405 Method Not Allowed
//! (a read-only file server asked to PUT, one without WebDAV asked to
//! PROPFIND) lacks it for good, so the answer is an error at once, in one
//! line that names the method, where object_store retries a 5xx ten times
//! and then reports the server's whole HTML page.

use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpErrorKind, HttpRequest, HttpResponse, HttpService,
    ReqwestConnector,
};
use object_store::{ClientOptions, path::Path};

/// What the server said it lacks.
#[derive(Debug, thiserror::Error)]
#[error(
    "the server does not support {method} (HTTP {status}); an http(s):// location is written with PUT, listed with PROPFIND and given folders with MKCOL, as a WebDAV server does: use one, or another store"
)]
struct Unsupported {
    method: String,
    status: u16,
}

/// Answers of 405 and 501 as errors; everything else as it comes.
#[derive(Debug)]
struct RefuseUnsupported(HttpClient);

#[async_trait::async_trait]
impl HttpService for RefuseUnsupported {
    async fn call(&self, req: HttpRequest) -> Result<HttpResponse, HttpError> {
        let method = req.method().to_string();
        let response = self.0.execute(req).await?;
        let status = response.status().as_u16();
        if matches!(status, 405 | 501) {
            // Unknown: object_store's client retries no error of this kind.
            return Err(HttpError::new(
                HttpErrorKind::Unknown,
                Unsupported { method, status },
            ));
        }
        Ok(response)
    }
}

#[derive(Debug, Default)]
struct Connector(ReqwestConnector);

impl HttpConnector for Connector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        Ok(HttpClient::new(RefuseUnsupported(self.0.connect(options)?)))
    }
}

/// The HTTP store at `url` (its scheme and host; `path` is the location
/// inside it), configured by `options` as object_store's own parser would.
pub(super) fn build(
    url: &url::Url,
    options: Vec<(String, String)>,
) -> object_store::Result<(Box<dyn object_store::ObjectStore>, Path)> {
    let path = Path::from_url_path(url.path())?;
    let base = &url[..url::Position::BeforePath];
    let mut builder = object_store::http::HttpBuilder::new()
        .with_url(base)
        .with_retry(super::client::http_retry())
        .with_http_connector(Connector::default());
    for (key, value) in options {
        if let Ok(key) = key.parse() {
            builder = builder.with_config(key, value);
        }
    }
    Ok((Box::new(builder.build()?), path))
}
