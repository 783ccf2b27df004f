//! Redis-style glob matching for `SCAN ... MATCH` and `CONFIG GET`: `*`, `?`, `[abc]`,
//! `[^a-z]`, and `\` escapes.

/// Iterative with single-star backtracking, so a hostile pattern costs O(len²) at worst
/// rather than exponential recursion.
pub fn matches(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, t));
            p += 1;
            continue;
        }
        if let Some(next_p) = match_one(pattern, p, text[t]) {
            p = next_p;
            t += 1;
            continue;
        }
        match star {
            Some((star_p, star_t)) => {
                star = Some((star_p, star_t + 1));
                p = star_p + 1;
                t = star_t + 1;
            }
            None => return false,
        }
    }
    pattern[p.min(pattern.len())..].iter().all(|&b| b == b'*')
}

/// If the pattern element at `p` matches `c`, the index after that element.
fn match_one(pattern: &[u8], p: usize, c: u8) -> Option<usize> {
    match *pattern.get(p)? {
        b'?' => Some(p + 1),
        b'\\' if p + 1 < pattern.len() => (pattern[p + 1] == c).then_some(p + 2),
        b'[' => class(pattern, p + 1, c),
        literal => (literal == c).then_some(p + 1),
    }
}

/// A `[...]` class starting after its `[`; an unterminated class runs to the end.
fn class(pattern: &[u8], mut p: usize, c: u8) -> Option<usize> {
    let negate = pattern.get(p) == Some(&b'^');
    if negate {
        p += 1;
    }
    let mut found = false;
    while p < pattern.len() && pattern[p] != b']' {
        if pattern[p] == b'\\' && p + 1 < pattern.len() {
            found |= pattern[p + 1] == c;
            p += 2;
        } else if p + 2 < pattern.len() && pattern[p + 1] == b'-' && pattern[p + 2] != b']' {
            let (lo, hi) = (
                pattern[p].min(pattern[p + 2]),
                pattern[p].max(pattern[p + 2]),
            );
            found |= (lo..=hi).contains(&c);
            p += 3;
        } else {
            found |= pattern[p] == c;
            p += 1;
        }
    }
    (found != negate).then_some((p + 1).min(pattern.len()))
}

#[cfg(test)]
mod tests {
    use super::matches;

    #[test]
    fn globs_match_like_redis() {
        assert!(matches(b"*", b""));
        assert!(matches(b"user:*", b"user:42"));
        assert!(!matches(b"user:*", b"use"));
        assert!(matches(b"h?llo", b"hello"));
        assert!(matches(b"h[ae]llo", b"hallo"));
        assert!(!matches(b"h[^e]llo", b"hello"));
        assert!(matches(b"h[a-c]llo", b"hbllo"));
        assert!(matches(b"a*b*c", b"a__b__c"));
        assert!(!matches(b"a*b*c", b"a__b__d"));
        assert!(matches(b"\\*", b"*"));
        assert!(!matches(b"\\*", b"x"));
        assert!(matches(b"max*", b"maxmemory"));
    }
}
