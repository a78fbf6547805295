//! Strict Ed25519 (the checks ring's verification leaves out): no
//! small-order or non-canonical public key or `R`, and a canonical `S`
//! (below the group order), so that one signature has one meaning.

/// The field prime 2^255 - 19, little-endian.
const P: [u8; 32] = {
    let mut p = [0xff; 32];
    p[0] = 0xed;
    p[31] = 0x7f;
    p
};

/// The group order L = 2^252 + 27742317777372353535851937790883648493,
/// little-endian.
const L: [u8; 32] = [
    0xed, 0xd3, 0xf5, 0x5c, 0x1a, 0x63, 0x12, 0x58, 0xd6, 0x9c, 0xf7, 0xa2, 0xde, 0xf9, 0xde, 0x14,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10,
];

/// The y coordinates of the points of small order (1, 2, 4, 8), and
/// their non-canonical spellings y + p, compared without the sign bit.
const SMALL_ORDER: [[u8; 32]; 7] = {
    let zero = [0u8; 32];
    let mut one = [0u8; 32];
    one[0] = 1;
    let order8_a = [
        0x26, 0xe8, 0x95, 0x8f, 0xc2, 0xb2, 0x27, 0xb0, 0x45, 0xc3, 0xf4, 0x89, 0xf2, 0xef, 0x98,
        0xf0, 0xd5, 0xdf, 0xac, 0x05, 0xd3, 0xc6, 0x33, 0x39, 0xb1, 0x38, 0x02, 0x88, 0x6d, 0x53,
        0xfc, 0x05,
    ];
    let order8_b = [
        0xc7, 0x17, 0x6a, 0x70, 0x3d, 0x4d, 0xd8, 0x4f, 0xba, 0x3c, 0x0b, 0x76, 0x0d, 0x10, 0x67,
        0x0f, 0x2a, 0x20, 0x53, 0xfa, 0x2c, 0x39, 0xcc, 0xc6, 0x4e, 0xc7, 0xfd, 0x77, 0x92, 0xac,
        0x03, 0x7a,
    ];
    let mut p_minus_1 = P;
    p_minus_1[0] = 0xec;
    let p = P;
    let mut p_plus_1 = P;
    p_plus_1[0] = 0xee;
    [zero, one, order8_a, order8_b, p_minus_1, p, p_plus_1]
};

/// Little-endian `a < b`.
fn less(a: &[u8; 32], b: &[u8; 32]) -> bool {
    for i in (0..32).rev() {
        if a[i] != b[i] {
            return a[i] < b[i];
        }
    }
    false
}

/// Whether the encoding's y (the sign bit cleared) is below p.
pub(super) fn canonical_point(encoded: &[u8; 32]) -> bool {
    let mut y = *encoded;
    y[31] &= 0x7f;
    less(&y, &P)
}

/// Whether the encoded point has a small order (1, 2, 4 or 8).
pub(super) fn small_order(encoded: &[u8; 32]) -> bool {
    let mut y = *encoded;
    y[31] &= 0x7f;
    SMALL_ORDER.contains(&y)
}

/// `R` canonical and not of small order, `S` below L.
pub(super) fn signature_acceptable(signature: &[u8; 64]) -> bool {
    let (r, s) = signature.split_at(32);
    let r: [u8; 32] = r.try_into().unwrap_or([0; 32]);
    let s: [u8; 32] = s.try_into().unwrap_or(L);
    canonical_point(&r) && !small_order(&r) && less(&s, &L)
}

#[cfg(test)]
pub(super) const GROUP_ORDER: [u8; 32] = L;
