//! A small HTTP/1.1 server side: request parsing (Content-Length and chunked
//! bodies, bounded) and response writing. Keep-alive is the caller's loop.

use std::io::{self, BufRead, Read, Write};

/// Largest request head (request line and headers).
pub const MAX_HEAD: usize = 64 * 1024;
/// Largest request body.
pub const MAX_BODY: usize = 16 * 1024 * 1024;

/// A parsed request.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// `GET`, `POST`, ...
    pub method: String,
    /// Path with query.
    pub path: String,
    /// Header names lowercased, in order.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl Request {
    /// The first header of that (lowercase) name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Whether the client asked to close the connection after this request.
    pub fn wants_close(&self) -> bool {
        self.header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"))
    }
}

fn bad(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_owned())
}

fn read_line(r: &mut impl BufRead, budget: &mut usize) -> io::Result<String> {
    let mut line = Vec::new();
    let n = r.take(*budget as u64 + 1).read_until(b'\n', &mut line)?;
    if n > *budget {
        return Err(bad("request head too large"));
    }
    *budget -= n;
    if n == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed",
        ));
    }
    while line.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        line.pop();
    }
    String::from_utf8(line).map_err(|_| bad("request head is not UTF-8"))
}

/// Reads one request. `Ok(None)` when the peer closed the connection
/// cleanly between requests.
pub fn read_request(r: &mut impl BufRead) -> io::Result<Option<Request>> {
    if r.fill_buf()?.is_empty() {
        return Ok(None);
    }
    let mut budget = MAX_HEAD;
    let request_line = read_line(r, &mut budget)?;
    let mut parts = request_line.split(' ');
    let (Some(method), Some(path), Some(version)) = (parts.next(), parts.next(), parts.next())
    else {
        return Err(bad("malformed request line"));
    };
    if !version.starts_with("HTTP/1.") {
        return Err(bad("not HTTP/1.x"));
    }
    let mut headers = Vec::new();
    loop {
        let line = read_line(r, &mut budget)?;
        if line.is_empty() {
            break;
        }
        let (k, v) = line
            .split_once(':')
            .ok_or_else(|| bad("malformed header"))?;
        headers.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
    }
    let mut req = Request {
        method: method.to_owned(),
        path: path.to_owned(),
        headers,
        body: Vec::new(),
    };
    if req
        .header("transfer-encoding")
        .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
    {
        req.body = read_chunked(r)?;
    } else if let Some(len) = req.header("content-length") {
        let len: usize = len.parse().map_err(|_| bad("bad content-length"))?;
        if len > MAX_BODY {
            return Err(bad("request body too large"));
        }
        let mut body = vec![0; len];
        r.read_exact(&mut body)?;
        req.body = body;
    }
    Ok(Some(req))
}

fn read_chunked(r: &mut impl BufRead) -> io::Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let mut budget = 1024;
        let size_line = read_line(r, &mut budget)?;
        let size = usize::from_str_radix(size_line.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| bad("bad chunk size"))?;
        if body.len() + size > MAX_BODY {
            return Err(bad("request body too large"));
        }
        if size == 0 {
            // Trailers, then the empty line.
            let mut budget = MAX_HEAD;
            while !read_line(r, &mut budget)?.is_empty() {}
            return Ok(body);
        }
        let start = body.len();
        body.resize(start + size, 0);
        r.read_exact(&mut body[start..])?;
        let mut budget = 2;
        if !read_line(r, &mut budget)?.is_empty() {
            return Err(bad("chunk not followed by CRLF"));
        }
    }
}

/// A response to write.
#[derive(Debug, Clone, PartialEq)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Extra headers.
    pub headers: Vec<(String, String)>,
    /// Body bytes.
    pub body: Vec<u8>,
    /// Content type of the body.
    pub content_type: &'static str,
}

impl Response {
    /// A JSON response.
    pub fn json(status: u16, body: &serde_json::Value) -> Response {
        Response {
            status,
            headers: Vec::new(),
            body: body.to_string().into_bytes(),
            content_type: "application/json",
        }
    }

    /// A plain-text response.
    pub fn text(status: u16, body: impl Into<String>) -> Response {
        Response {
            status,
            headers: Vec::new(),
            body: body.into().into_bytes(),
            content_type: "text/plain; charset=utf-8",
        }
    }

    /// Adds a header.
    pub fn header(mut self, k: &str, v: &str) -> Response {
        self.headers.push((k.to_owned(), v.to_owned()));
        self
    }
}

/// The head of a response with a `Content-Length` of `len`.
pub fn head(
    status: u16,
    content_type: &str,
    len: usize,
    headers: &[(String, String)],
    close: bool,
) -> String {
    let mut h = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: {content_type}\r\nContent-Length: {len}\r\nConnection: {}\r\n",
        reason(status),
        if close { "close" } else { "keep-alive" }
    );
    for (k, v) in headers {
        h.push_str(&format!("{k}: {v}\r\n"));
    }
    h.push_str("\r\n");
    h
}

/// Writes a whole response.
pub fn write_response(
    w: &mut (impl Write + ?Sized),
    resp: &Response,
    close: bool,
) -> io::Result<()> {
    w.write_all(
        head(
            resp.status,
            resp.content_type,
            resp.body.len(),
            &resp.headers,
            close,
        )
        .as_bytes(),
    )?;
    w.write_all(&resp.body)?;
    w.flush()
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        204 => "No Content",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        422 => "Unprocessable Entity",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Status",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::BufReader;

    #[test]
    fn parses_keep_alive_requests_in_sequence() {
        let raw = b"POST /a HTTP/1.1\r\nContent-Length: 2\r\nX-Y: z\r\n\r\n{}GET /b HTTP/1.1\r\nConnection: close\r\n\r\n";
        let mut r = BufReader::new(&raw[..]);
        let a = read_request(&mut r).unwrap().unwrap();
        assert_eq!(
            (a.method.as_str(), a.path.as_str(), a.body.as_slice()),
            ("POST", "/a", &b"{}"[..])
        );
        assert_eq!(a.header("x-y"), Some("z"));
        let b = read_request(&mut r).unwrap().unwrap();
        assert_eq!(b.path, "/b");
        assert!(b.wants_close());
        assert!(read_request(&mut r).unwrap().is_none());
    }

    #[test]
    fn parses_chunked_bodies() {
        let raw = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n";
        let req = read_request(&mut BufReader::new(&raw[..]))
            .unwrap()
            .unwrap();
        assert_eq!(req.body, b"abcde");
    }

    #[test]
    fn refuses_oversized_bodies_and_heads() {
        let raw = format!(
            "POST / HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
            MAX_BODY + 1
        );
        assert!(read_request(&mut BufReader::new(raw.as_bytes())).is_err());
        let raw = format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(MAX_HEAD));
        assert!(read_request(&mut BufReader::new(raw.as_bytes())).is_err());
        assert!(read_request(&mut BufReader::new(&b"garbage\r\n\r\n"[..])).is_err());
    }

    #[test]
    fn writes_a_response() {
        let mut out = Vec::new();
        write_response(
            &mut out,
            &Response::json(200, &serde_json::json!({"a": 1})).header("Retry-After", "3"),
            false,
        )
        .unwrap();
        let s = String::from_utf8(out).unwrap();
        assert!(s.starts_with("HTTP/1.1 200 OK\r\n"));
        assert!(
            s.contains("Content-Length: 7\r\n")
                && s.contains("Retry-After: 3\r\n")
                && s.ends_with("\r\n\r\n{\"a\":1}")
        );
    }
}
