//! The one bounded read of an answer's body, for both clients: a body over
//! its limit is refused (a 2xx: the caller cannot use half of it) or cut
//! (an error answer's page: its status says what happens next), never
//! buffered whole.

use std::io::Read;

/// What a read does with a body longer than its limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Over {
    /// Refused: [`BodyError::TooLarge`]. A `Content-Length` over the limit
    /// is refused before a byte is read.
    Refuse,
    /// Cut to the limit, no error.
    Cut,
}

/// A body that could not be read whole.
#[derive(Debug)]
pub enum BodyError {
    /// Longer than the limit (with [`Over::Refuse`]).
    TooLarge(u64),
    /// The connection failed while it was read.
    Read(ureq::Error),
}

/// Reads `body` into `into` (emptied first, its capacity kept), at most
/// `limit` bytes; a body of exactly `limit` bytes is read whole.
pub fn read_body(
    body: &mut ureq::Body,
    limit: u64,
    over: Over,
    into: &mut Vec<u8>,
) -> Result<(), BodyError> {
    into.clear();
    if over == Over::Refuse && body.content_length().is_some_and(|n| n > limit) {
        return Err(BodyError::TooLarge(limit));
    }
    let read = match over {
        Over::Refuse => body.with_config().limit(limit).reader().read_to_end(into),
        Over::Cut => body.as_reader().take(limit).read_to_end(into),
    };
    match read.map_err(ureq::Error::from) {
        Ok(_) => Ok(()),
        Err(ureq::Error::BodyExceedsLimit(_)) => Err(BodyError::TooLarge(limit)),
        Err(e) => Err(BodyError::Read(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sized(bytes: &[u8]) -> ureq::Body {
        ureq::Body::builder().data(bytes.to_vec())
    }

    fn streamed(bytes: &[u8]) -> ureq::Body {
        ureq::Body::builder().reader(std::io::Cursor::new(bytes.to_vec()))
    }

    #[test]
    fn a_body_at_its_limit_is_read_whole_and_one_over_it_is_refused() {
        let mut into = b"stale".to_vec();
        read_body(&mut sized(b"0123456789"), 10, Over::Refuse, &mut into).unwrap();
        assert_eq!(into, b"0123456789");
        for mut body in [sized(b"0123456789x"), streamed(b"0123456789x")] {
            match read_body(&mut body, 10, Over::Refuse, &mut into) {
                Err(BodyError::TooLarge(10)) => {}
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn an_error_page_is_cut_not_refused() {
        let mut into = Vec::new();
        read_body(&mut streamed(b"0123456789"), 4, Over::Cut, &mut into).unwrap();
        assert_eq!(into, b"0123");
    }
}
