//! HGETALL, HKEYS and HVALS of a hash too large for one reply, sent a part at a time as
//! the connection's output drains, so that no hash is too large to read and none makes
//! the server hold more than the output budget and one value for its reply.
//!
//! The reply's length goes out first: the live fields of the hash as it stood when the
//! command ran (its header read, its elements found whole, the expiries judged at that
//! moment). Each part is then read under the key's stripe lock, after checking that the
//! hash is still that one: a large hash's header takes a new CAS version at every write
//! of the hash (`header_put`), and every write holds the stripe lock from its first
//! element to its header, so an unchanged version means unchanged elements. A hash
//! written, deleted, expired or evicted part-way cannot keep the promised length: the
//! caller ends the reply short and closes the connection (as an MGET whose engine failed
//! part-way), which a client reads as a failed command, never as fields of another
//! version of the hash. Expired fields met are left for the next command that writes the
//! hash to delete: a delete here would change the version the rest of the reply checks.

use super::format::{HashId, Layout, PackedFields};
use super::{HashError, Hashes, Pairs, Part, REPLY_OVERHEAD, Result, elements, live_elements};
use crate::core::keyspace::Keyspace;

/// A whole-hash read as it starts.
pub enum All {
    /// Every field of a packed hash, none expired, in one reply from its header's bytes.
    Packed(PackedFields),
    /// Every live field, in one reply.
    Whole(Pairs),
    /// `count` live fields, sent by [`Hashes::next_part`].
    Streamed { count: u64, stream: Streamed },
}

/// A whole-hash read part-way out: where it stopped, and what it promised.
pub struct Streamed {
    key: Vec<u8>,
    id: HashId,
    /// The header's version when the read started.
    version: u64,
    /// When the read started: fields live then are sent.
    now_ms: u64,
    part: Part,
    /// Live fields promised and not sent yet.
    left: u64,
    /// The last field examined.
    after: Option<Vec<u8>>,
}

impl Streamed {
    /// Every promised field was sent.
    pub fn done(&self) -> bool {
        self.left == 0
    }

    pub fn part(&self) -> Part {
        self.part
    }
}

impl Hashes {
    /// HGETALL / HKEYS / HVALS: every live field and value in field order, as `part` says
    /// (the other half empty) — in one reply if it fits `budget` bytes, else promised
    /// and then sent a part at a time. Nothing if the key holds no hash, or if the hash
    /// was partial (then it is dropped).
    pub fn read_all(&self, keys: &Keyspace, key: &[u8], part: Part, budget: usize) -> Result<All> {
        // A session's hash, the common case: sent from its header as read, no field
        // copied. One with an expired field (deleted as it is read), or whose reply may
        // pass `budget`, is read as any other.
        let Some(read) = self.header(keys, key)? else {
            return Ok(All::Whole(Vec::new()));
        };
        if let Layout::Packed(fields) = read.layout {
            let now_ms = keys.engine().now_ms();
            let reply_bytes: usize = fields
                .iter()
                .map(|f| part.bytes(f.name(&read.bytes), f.value(&read.bytes)) + 2 * REPLY_OVERHEAD)
                .sum();
            if reply_bytes <= budget
                && fields
                    .iter()
                    .all(|f| f.expires_at_ms.is_none_or(|t| t > now_ms))
            {
                return Ok(All::Packed(PackedFields::new(read.bytes, fields)));
            }
        }
        match self.all(keys, key, part, budget) {
            Err(HashError::TooLarge { .. }) => self.start(keys, key, part, budget),
            whole => whole.map(All::Whole),
        }
    }

    /// A read of a hash too large for one reply, promised as it stands now.
    fn start(&self, keys: &Keyspace, key: &[u8], part: Part, budget: usize) -> Result<All> {
        let _locked = self.lock(key);
        let Some(read) = self.header(keys, key)? else {
            return Ok(All::Whole(Vec::new()));
        };
        // A packed hash is never that large; a header written before headers took
        // versions cannot be checked part-way (the next write of the hash gives one).
        let (Layout::Elements(header), version @ 1..) = (read.layout, read.version) else {
            return Err(HashError::TooLarge { budget });
        };
        let now_ms = keys.engine().now_ms();
        let Some(count) = live_elements(keys, header, now_ms)? else {
            self.drop_partial(keys, key, header)?;
            return Ok(All::Whole(Vec::new()));
        };
        let stream = Streamed {
            key: key.to_vec(),
            id: header.id,
            version,
            now_ms,
            part,
            left: count,
            after: None,
        };
        Ok(All::Streamed { count, stream })
    }

    /// The next live fields of a streamed read, about `budget` bytes of them (past it by
    /// one field at most); `None` if the hash is no longer the one whose length went out.
    pub fn next_part(
        &self,
        keys: &Keyspace,
        stream: &mut Streamed,
        budget: usize,
    ) -> Result<Option<Pairs>> {
        let _locked = self.lock(&stream.key);
        match self.header(keys, &stream.key) {
            Ok(Some(read)) if read.version == stream.version => {}
            Ok(_) | Err(HashError::WrongType) => return Ok(None),
            Err(e) => return Err(e),
        }
        let walked = elements::walk(
            keys,
            stream.id,
            stream.after.as_deref(),
            usize::MAX,
            budget,
            stream.part,
            stream.now_ms,
        )?;
        let sent = walked.live.len() as u64;
        // Fewer than promised when the elements ran out: some were evicted.
        if sent > stream.left || (walked.next.is_none() && sent < stream.left) {
            return Ok(None);
        }
        stream.left -= sent;
        stream.after = walked.next;
        Ok(Some(walked.live))
    }
}
