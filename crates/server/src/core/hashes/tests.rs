use std::sync::Arc;

use super::format::element_key;
use super::*;

fn keyspace(dram: u64) -> Keyspace {
    let engine = zipcache::ZipCache::open(zipcache::Config {
        dram_capacity: dram,
        ..zipcache::Config::default()
    })
    .unwrap();
    Keyspace::new(Arc::new(engine), Arc::default())
}

fn pairs(list: &[(&str, &str)]) -> Vec<(Vec<u8>, Vec<u8>)> {
    list.iter()
        .map(|(f, v)| (f.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect()
}

/// The layout of the hash at `key`.
fn layout(hashes: &Hashes, keys: &Keyspace, key: &[u8]) -> Layout {
    hashes.header(keys, key).unwrap().unwrap().layout
}

fn elements_header(hashes: &Hashes, keys: &Keyspace, key: &[u8]) -> Header {
    match layout(hashes, keys, key) {
        Layout::Elements(header) => header,
        packed => panic!("a packed hash: {packed:?}"),
    }
}

/// A hash grown past the packed limits: `n` fields `f000`… of value `v`.
fn grown(hashes: &Hashes, keys: &Keyspace, key: &[u8], n: usize) {
    let names: Vec<Vec<u8>> = (0..n).map(|i| format!("f{i:03}").into_bytes()).collect();
    let args: Vec<&[u8]> = names.iter().flat_map(|n| [n.as_slice(), b"v"]).collect();
    hashes.set(keys, key, &args, false).unwrap();
}

/// Every command on a small hash (packed) and on one grown past the packed limits
/// (elements) answers the same.
#[test]
fn a_hash_is_set_read_counted_and_deleted_in_either_layout() {
    for extra in [0, 200] {
        let keys = keyspace(8 << 20);
        let hashes = Hashes::default();
        grown(&hashes, &keys, b"h", extra);
        let expected_layout_is_packed = extra == 0;
        let set = |p: &[&[u8]]| hashes.set(&keys, b"h", p, false).unwrap();
        assert_eq!(set(&[b"b", b"2", b"a", b"1"]), 2);
        assert_eq!(set(&[b"a", b"one", b"c", b"3", b"c", b"three"]), 1);
        assert_eq!(
            matches!(layout(&hashes, &keys, b"h"), Layout::Packed(_)),
            expected_layout_is_packed
        );
        assert_eq!(hashes.set(&keys, b"h", &[b"a", b"x"], true).unwrap(), 0);
        assert_eq!(hashes.set(&keys, b"h", &[b"d", b"4"], true).unwrap(), 1);
        assert_eq!(hashes.len(&keys, b"h").unwrap(), 4 + extra as u64);
        let all = hashes.all(&keys, b"h", Part::Both, 1 << 20).unwrap();
        assert_eq!(
            all[..4],
            pairs(&[("a", "one"), ("b", "2"), ("c", "three"), ("d", "4")])
        );
        assert_eq!(
            hashes.get(&keys, b"h", &[b"a", b"zz"], usize::MAX).unwrap(),
            Some(vec![Some(b"one".to_vec()), None])
        );
        assert_eq!(
            hashes.get(&keys, b"nope", &[b"a"], usize::MAX).unwrap(),
            None
        );
        assert_eq!(
            hashes
                .delete_fields(&keys, b"h", &[b"a", b"a", b"zz"])
                .unwrap(),
            1
        );
        assert_eq!(hashes.len(&keys, b"h").unwrap(), 3 + extra as u64);
        // A string is the wrong type, and a hash is to the string view absent.
        keys.put_with(b"s", b"v", PutOptions::default()).unwrap();
        assert!(matches!(
            hashes.set(&keys, b"s", &[b"a", b"1"], false),
            Err(HashError::WrongType)
        ));
        assert_eq!(
            keys.strings_only()
                .get_item(b"h", GetOptions::default())
                .unwrap(),
            None
        );
        assert!(
            keys.get_item(b"h", GetOptions::default())
                .unwrap()
                .unwrap()
                .collection
        );
        // DEL takes the header and every element.
        assert!(hashes.delete_key(&keys, b"h").unwrap());
        assert!(!hashes.delete_key(&keys, b"h").unwrap());
        assert!(hashes.delete_key(&keys, b"s").unwrap());
        let left = keys.engine().scan_keys::<&[u8]>(.., 100).unwrap();
        assert!(left.is_empty(), "{left:?}");
    }
}

#[test]
fn the_last_field_deleted_deletes_the_hash() {
    let keys = keyspace(8 << 20);
    let hashes = Hashes::default();
    hashes
        .set(&keys, b"h", &[b"a", b"1", b"b", b"2"], false)
        .unwrap();
    assert_eq!(hashes.delete_fields(&keys, b"h", &[b"b", b"a"]).unwrap(), 2);
    assert_eq!(keys.info(b"h").unwrap(), None);
}

#[test]
fn a_hash_grows_from_packed_to_elements_at_either_limit() {
    let keys = keyspace(8 << 20);
    let hashes = Hashes::default();
    grown(&hashes, &keys, b"many", PACKED_MAX_FIELDS);
    assert!(matches!(layout(&hashes, &keys, b"many"), Layout::Packed(_)));
    hashes
        .set(&keys, b"many", &[b"one-more", b"v"], false)
        .unwrap();
    assert_eq!(
        elements_header(&hashes, &keys, b"many").elements,
        PACKED_MAX_FIELDS as u64 + 1
    );
    let long = vec![b'x'; PACKED_MAX_BYTES];
    hashes.set(&keys, b"big", &[b"a", b"small"], false).unwrap();
    assert!(matches!(layout(&hashes, &keys, b"big"), Layout::Packed(_)));
    hashes.set(&keys, b"big", &[b"b", &long], false).unwrap();
    assert_eq!(elements_header(&hashes, &keys, b"big").elements, 2);
    assert_eq!(
        hashes.all(&keys, b"big", Part::Both, 1 << 20).unwrap(),
        vec![(b"a".to_vec(), b"small".to_vec()), (b"b".to_vec(), long)]
    );
}

#[test]
fn a_hash_replaced_by_a_string_and_made_again_never_shows_old_fields() {
    for extra in [0, 200] {
        let keys = keyspace(8 << 20);
        let hashes = Hashes::default();
        grown(&hashes, &keys, b"h", extra);
        hashes.set(&keys, b"h", &[b"old", b"1"], false).unwrap();
        keys.put_with(b"h", b"string", PutOptions::default())
            .unwrap();
        keys.delete(b"h").unwrap();
        hashes.set(&keys, b"h", &[b"new", b"2"], false).unwrap();
        assert_eq!(
            hashes.all(&keys, b"h", Part::Both, 1 << 20).unwrap(),
            pairs(&[("new", "2")])
        );
        assert_eq!(
            hashes.get(&keys, b"h", &[b"old"], usize::MAX).unwrap(),
            Some(vec![None])
        );
        assert_eq!(hashes.len(&keys, b"h").unwrap(), 1);
    }
}

/// A hash that lost an element (dropped by eviction) reads as gone, never as fewer
/// fields.
#[test]
fn a_partial_hash_reads_as_gone_and_is_dropped() {
    let keys = keyspace(8 << 20);
    let hashes = Hashes::default();
    grown(&hashes, &keys, b"h", 200);
    let header = elements_header(&hashes, &keys, b"h");
    keys.engine()
        .delete(&element_key(header.id, b"f100"))
        .unwrap();
    assert_eq!(
        hashes.get(&keys, b"h", &[b"f000"], usize::MAX).unwrap(),
        Some(vec![Some(b"v".to_vec())])
    );
    assert_eq!(hashes.len(&keys, b"h").unwrap(), 0);
    assert_eq!(keys.info(b"h").unwrap(), None);
    assert!(
        keys.engine()
            .scan_keys::<&[u8]>(.., 1000)
            .unwrap()
            .is_empty()
    );
    grown(&hashes, &keys, b"h", 200);
    let header = elements_header(&hashes, &keys, b"h");
    keys.engine()
        .delete(&element_key(header.id, b"f000"))
        .unwrap();
    assert!(
        hashes
            .all(&keys, b"h", Part::Both, 1 << 20)
            .unwrap()
            .is_empty()
    );
    assert_eq!(keys.info(b"h").unwrap(), None);
    grown(&hashes, &keys, b"h", 200);
    let header = elements_header(&hashes, &keys, b"h");
    keys.engine()
        .delete(&element_key(header.id, b"f199"))
        .unwrap();
    let (found, next) = hashes
        .scan(&keys, b"h", None, 10, Part::Both, 1 << 20)
        .unwrap();
    assert!(
        found.is_empty() && next.is_none(),
        "HSCAN of a partial hash"
    );
}

#[test]
fn expired_fields_are_never_served_and_leave_the_count() {
    for extra in [0, 200] {
        let keys = keyspace(8 << 20);
        let hashes = Hashes::default();
        grown(&hashes, &keys, b"h", extra);
        hashes
            .set(&keys, b"h", &[b"a", b"1", b"b", b"2"], false)
            .unwrap();
        let soon = keys.engine().now_ms() + 50;
        let codes = hashes
            .expire_fields(&keys, b"h", &[b"b", b"zz"], soon, ExpiryCondition::Always)
            .unwrap();
        assert_eq!(codes, [1, NO_FIELD]);
        assert_eq!(hashes.len(&keys, b"h").unwrap(), 2 + extra as u64);
        std::thread::sleep(std::time::Duration::from_millis(80));
        assert_eq!(
            hashes.get(&keys, b"h", &[b"b"], usize::MAX).unwrap(),
            Some(vec![None])
        );
        assert_eq!(hashes.len(&keys, b"h").unwrap(), 1 + extra as u64);
        assert_eq!(
            hashes.all(&keys, b"h", Part::Both, 1 << 20).unwrap()[0],
            pairs(&[("a", "1")])[0]
        );
        if extra > 0 {
            assert_eq!(elements_header(&hashes, &keys, b"h").volatile, 0);
        }
        assert_eq!(hashes.set(&keys, b"h", &[b"b", b"new"], false).unwrap(), 1);
        assert_eq!(hashes.len(&keys, b"h").unwrap(), 2 + extra as u64);
        // A time already past deletes the field at once.
        let now = keys.engine().now_ms();
        let codes = hashes
            .expire_fields(&keys, b"h", &[b"b"], now, ExpiryCondition::Always)
            .unwrap();
        assert_eq!(codes, [2]);
        assert_eq!(
            hashes.get(&keys, b"h", &[b"b"], usize::MAX).unwrap(),
            Some(vec![None])
        );
    }
}

#[test]
fn increments_keep_the_field_and_errors_change_nothing() {
    let keys = keyspace(8 << 20);
    let hashes = Hashes::default();
    let add = |field: &[u8], n: i64| {
        hashes
            .update_field(&keys, b"h", field, |old| {
                let old: i64 = match old {
                    None => 0,
                    Some(text) => std::str::from_utf8(text)
                        .ok()
                        .and_then(|t| t.parse().ok())
                        .ok_or("not an integer")?,
                };
                Ok::<_, &str>((old + n).to_string().into_bytes())
            })
            .unwrap()
    };
    assert_eq!(add(b"n", 5), Ok(b"5".to_vec()));
    assert_eq!(add(b"n", -2), Ok(b"3".to_vec()));
    hashes.set(&keys, b"h", &[b"t", b"text"], false).unwrap();
    assert_eq!(add(b"t", 1), Err("not an integer"));
    assert_eq!(hashes.len(&keys, b"h").unwrap(), 2);
}

#[test]
fn fields_too_long_for_an_element_key_are_refused_before_any_write() {
    let keys = keyspace(8 << 20);
    let hashes = Hashes::default();
    let long = vec![b'f'; Hashes::max_field(&keys) + 1];
    assert!(matches!(
        hashes.set(&keys, b"h", &[b"a", b"1", &long, b"2"], false),
        Err(HashError::FieldTooLong { .. })
    ));
    assert_eq!(keys.info(b"h").unwrap(), None);
    let longest = vec![b'f'; Hashes::max_field(&keys)];
    assert_eq!(
        hashes.set(&keys, b"h", &[&longest, b"1"], false).unwrap(),
        1
    );
}

#[test]
fn scans_of_either_layout_go_on_where_they_stopped() {
    for n in [20, 300] {
        let keys = keyspace(8 << 20);
        let hashes = Hashes::default();
        grown(&hashes, &keys, b"h", n);
        // The last field of each page of 7 expires: a page may end on a dead field.
        let soon = FieldExpiry::At(keys.engine().now_ms() + 50);
        let expiring = |i: usize| i % 7 == 6;
        for i in (0..n).filter(|&i| expiring(i)) {
            let field = format!("f{i:03}").into_bytes();
            hashes
                .set_expiring(&keys, b"h", &[&field, b"v"], Exists::Any, soon)
                .unwrap();
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        let (mut seen, mut after) = (Vec::new(), None);
        loop {
            let (found, next) = hashes
                .scan(&keys, b"h", after.as_deref(), 7, Part::Fields, 1 << 20)
                .unwrap();
            assert!(found.len() <= 7);
            seen.extend(found.into_iter().map(|(f, _)| f));
            match next {
                Some(field) => after = Some(field),
                None => break,
            }
        }
        let want: Vec<Vec<u8>> = (0..n)
            .filter(|&i| !expiring(i))
            .map(|i| format!("f{i:03}").into_bytes())
            .collect();
        assert_eq!(seen, want, "{n} fields");
    }
}

/// A command may name a great many fields (one HSET of 100,000, one HDEL of them all, a
/// field named twice among them): each is found by name, never by a walk of the others.
#[test]
fn a_command_of_a_great_many_fields_counts_each_once() {
    let keys = keyspace(64 << 20);
    let hashes = Hashes::default();
    let names: Vec<Vec<u8>> = (0..100_000)
        .map(|i| format!("field:{i:06}").into_bytes())
        .collect();
    let mut args: Vec<&[u8]> = names.iter().flat_map(|n| [n.as_slice(), b"v"]).collect();
    args.extend([names[7].as_slice(), b"again"]);
    assert_eq!(hashes.set(&keys, b"h", &args, false).unwrap(), 100_000);
    assert_eq!(hashes.len(&keys, b"h").unwrap(), 100_000);
    assert_eq!(
        hashes.get(&keys, b"h", &[&names[7]], usize::MAX).unwrap(),
        Some(vec![Some(b"again".to_vec())])
    );
    let all: Vec<&[u8]> = names.iter().map(Vec::as_slice).collect();
    assert_eq!(hashes.delete_fields(&keys, b"h", &all).unwrap(), 100_000);
    assert_eq!(keys.info(b"h").unwrap(), None);
}

/// RENAME of a large hash copies its elements under a new id: the destination holds
/// every field, the source's elements are gone with it, and neither key's later writes
/// show through the other. A packed hash and a string move as their bytes, with their
/// expiry; the destination's own elements go.
#[test]
fn a_renamed_hash_shares_no_fields_with_its_old_key() {
    let keys = keyspace(8 << 20);
    let hashes = Hashes::default();
    grown(&hashes, &keys, b"big", 200);
    let old = elements_header(&hashes, &keys, b"big");
    grown(&hashes, &keys, b"target", 150);
    let replaced = elements_header(&hashes, &keys, b"target");
    assert_eq!(
        hashes.rename(&keys, b"big", b"target", false).unwrap(),
        Renamed::Done
    );
    let new = elements_header(&hashes, &keys, b"target");
    assert_ne!(new.id, old.id);
    assert_eq!((new.elements, new.volatile), (old.elements, old.volatile));
    assert_eq!(keys.info(b"big").unwrap(), None);
    let all = keys.engine().scan_keys::<&[u8]>(.., 10_000).unwrap();
    assert_eq!(
        all.len(),
        1 + 200,
        "the source's and the replaced hash's elements are deleted"
    );
    for gone in [old.id, replaced.id] {
        let (start, end) = format::element_range(gone);
        let left = keys
            .engine()
            .scan_keys::<&[u8]>(start.as_slice()..end.as_slice(), 10)
            .unwrap();
        assert!(left.is_empty(), "{gone:?}: {} left", left.len());
    }
    hashes
        .set(&keys, b"big", &[b"f001", b"new"], false)
        .unwrap();
    hashes
        .set(&keys, b"target", &[b"f002", b"changed"], false)
        .unwrap();
    let get = |key: &[u8], field: &[u8]| {
        hashes
            .get(&keys, key, &[field], usize::MAX)
            .unwrap()
            .unwrap()[0]
            .clone()
    };
    assert_eq!(get(b"target", b"f001"), Some(b"v".to_vec()));
    assert_eq!(get(b"big", b"f002"), None);
    assert_eq!(hashes.len(&keys, b"target").unwrap(), 200);
    assert_eq!(hashes.len(&keys, b"big").unwrap(), 1);

    // A packed hash and a string, with their expiry; RENAMENX onto a key refuses.
    let later = keys.engine().now_ms() + 60_000;
    hashes.set(&keys, b"small", &[b"a", b"1"], false).unwrap();
    let expiring = PutOptions {
        expires_at_ms: Some(later),
        ..PutOptions::default()
    };
    keys.put_with(b"s", b"text", expiring).unwrap();
    assert_eq!(
        hashes.rename(&keys, b"small", b"s", true).unwrap(),
        Renamed::DestinationExists
    );
    assert_eq!(
        hashes.rename(&keys, b"s", b"t", true).unwrap(),
        Renamed::Done
    );
    let moved = keys.get_item(b"t", GetOptions::default()).unwrap().unwrap();
    assert_eq!(
        (moved.value.as_slice(), moved.expires_at_ms),
        (&b"text"[..], Some(later))
    );
    assert_eq!(
        hashes.rename(&keys, b"small", b"t", false).unwrap(),
        Renamed::Done
    );
    assert_eq!(get(b"t", b"a"), Some(b"1".to_vec()));
    assert_eq!(keys.info(b"small").unwrap(), None);
    assert_eq!(
        hashes.rename(&keys, b"small", b"x", false).unwrap(),
        Renamed::NoSuchKey
    );
}

/// A large hash that lost an element is dropped by RENAME, which answers as for a
/// missing key: the copy is deleted again and the destination keeps what it held.
#[test]
fn a_partial_hash_is_not_renamed() {
    let keys = keyspace(8 << 20);
    let hashes = Hashes::default();
    grown(&hashes, &keys, b"h", 200);
    keys.put_with(b"d", b"kept", PutOptions::default()).unwrap();
    let header = elements_header(&hashes, &keys, b"h");
    keys.engine()
        .delete(&element_key(header.id, b"f123"))
        .unwrap();
    assert_eq!(
        hashes.rename(&keys, b"h", b"d", false).unwrap(),
        Renamed::NoSuchKey
    );
    assert_eq!(keys.info(b"h").unwrap(), None);
    let all = keys.engine().scan_keys::<&[u8]>(.., 10_000).unwrap();
    assert_eq!(all.len(), 1, "nothing but `d` is left");
    let kept = keys.get_item(b"d", GetOptions::default()).unwrap().unwrap();
    assert_eq!(kept.value, b"kept");
}

/// Every part of a streamed whole-hash read, until it is done; `None` if the hash
/// changed part-way.
fn stream_all(
    hashes: &Hashes,
    keys: &Keyspace,
    mut stream: Streamed,
    budget: usize,
) -> Option<Pairs> {
    let mut all = Vec::new();
    while !stream.done() {
        all.extend(hashes.next_part(keys, &mut stream, budget).unwrap()?);
    }
    Some(all)
}

/// A hash past the reply budget is read whole a part at a time: its length promised
/// first, its fields in order, expired ones left out, each part about the budget.
#[test]
fn a_hash_past_the_reply_budget_is_streamed_whole() {
    let keys = keyspace(32 << 20);
    let hashes = Hashes::default();
    grown(&hashes, &keys, b"h", 300);
    // f007 expires: the streams leave it out (and leave it for a write to delete).
    let soon = keys.engine().now_ms() + 50;
    hashes
        .set_expiring(
            &keys,
            b"h",
            &[b"f007", b"x"],
            Exists::Any,
            FieldExpiry::At(soon),
        )
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert!(matches!(
        hashes.all(&keys, b"h", Part::Both, 1000),
        Err(HashError::TooLarge { .. })
    ));
    let mut streamed = Vec::new();
    for part in [Part::Both, Part::Fields, Part::Values] {
        let All::Streamed { count, mut stream } = hashes.read_all(&keys, b"h", part, 1000).unwrap()
        else {
            panic!("not streamed");
        };
        assert_eq!(count, 299);
        let first = hashes.next_part(&keys, &mut stream, 1000).unwrap().unwrap();
        assert!((1..299).contains(&first.len()), "{}", first.len());
        let mut got = first;
        got.extend(stream_all(&hashes, &keys, stream, 1000).unwrap());
        streamed.push((part, got));
    }
    let whole = hashes.all(&keys, b"h", Part::Both, usize::MAX).unwrap();
    assert_eq!(whole.len(), 299);
    assert!(!whole.iter().any(|(f, _)| f == b"f007"));
    for (part, got) in streamed {
        let want: Pairs = whole
            .iter()
            .map(|(f, v)| part.keep(f.clone(), v.clone()))
            .collect();
        assert_eq!(got, want, "{part:?}");
    }
    // A renamed hash's header is versioned too.
    assert_eq!(
        hashes.rename(&keys, b"h", b"moved", false).unwrap(),
        Renamed::Done
    );
    let All::Streamed { stream, .. } = hashes.read_all(&keys, b"moved", Part::Both, 1000).unwrap()
    else {
        panic!("not streamed");
    };
    assert_eq!(stream_all(&hashes, &keys, stream, 1000).unwrap(), whole);
    // A small hash is still one reply.
    hashes.set(&keys, b"small", &[b"a", b"1"], false).unwrap();
    assert!(matches!(
        hashes.read_all(&keys, b"small", Part::Both, 1000).unwrap(),
        All::Packed(fields) if fields.pairs().eq([(&b"a"[..], &b"1"[..])])
    ));
    assert!(matches!(
        hashes.read_all(&keys, b"none", Part::Both, 1000).unwrap(),
        All::Whole(pairs) if pairs.is_empty()
    ));
}

/// HGETALL, HKEYS and HVALS of a packed hash send its fields from the header's bytes
/// as read — the same fields `all` copies out — unless one has expired (then it is read
/// as before, and the expired field deleted) or the reply would pass the budget.
#[test]
fn a_packed_hash_is_sent_from_its_header_unless_a_field_expired() {
    let keys = keyspace(32 << 20);
    let hashes = Hashes::default();
    let fields: [&[u8]; 6] = [b"c", b"3", b"a", b"1", b"b", b"two"];
    hashes.set(&keys, b"s", &fields, false).unwrap();
    for part in [Part::Both, Part::Fields, Part::Values] {
        let All::Packed(packed) = hashes.read_all(&keys, b"s", part, 1000).unwrap() else {
            panic!("{part:?}: not sent from the header");
        };
        let copied = hashes.all(&keys, b"s", part, 1000).unwrap();
        assert_eq!(packed.len(), 3);
        for ((name, value), (want_name, want_value)) in packed.pairs().zip(&copied) {
            assert_eq!(name, want_name.as_slice());
            if part != Part::Fields {
                assert_eq!(value, want_value.as_slice());
            }
        }
    }
    assert!(matches!(
        hashes.read_all(&keys, b"s", Part::Both, 10),
        Err(HashError::TooLarge { .. })
    ));
    let soon = keys.engine().now_ms() + 30;
    hashes
        .set_expiring(
            &keys,
            b"s",
            &[b"b", b"two"],
            Exists::Any,
            FieldExpiry::At(soon),
        )
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(60));
    assert!(matches!(
        hashes.read_all(&keys, b"s", Part::Both, 1000).unwrap(),
        All::Whole(pairs) if pairs == [(b"a".to_vec(), b"1".to_vec()), (b"c".to_vec(), b"3".to_vec())]
    ));
    assert!(
        matches!(hashes.read_all(&keys, b"s", Part::Both, 1000).unwrap(), All::Packed(f) if f.len() == 2),
        "the expired field was deleted as it was read"
    );
}

/// A streamed read whose hash is written, deleted, replaced or loses an element
/// part-way stops: the rest of its promised length cannot be another hash's fields.
#[test]
fn a_streamed_read_stops_when_its_hash_changes() {
    let keys = keyspace(32 << 20);
    let hashes = Hashes::default();
    type Change<'a> = &'a dyn Fn(&Hashes, &Keyspace);
    let changes: [Change; 5] = [
        // A field's value overwritten: the header's bytes stay as they were.
        &|h, k| assert_eq!(h.set(k, b"h", &[b"f250", b"new"], false).unwrap(), 0),
        &|h, k| assert_eq!(h.delete_fields(k, b"h", &[b"f250"]).unwrap(), 1),
        &|h, k| assert!(h.delete_key(k, b"h").unwrap()),
        &|_, k| {
            let string = Update::Put {
                value: b"a string".to_vec(),
                options: PutOptions::default(),
            };
            k.update(b"h", |_| (string, ())).unwrap();
        },
        // An element evicted (deleted under the hash).
        &|h, k| {
            let id = elements_header(h, k, b"h").id;
            assert!(k.engine().delete(&element_key(id, b"f250")).unwrap());
        },
    ];
    for (n, change) in changes.iter().enumerate() {
        grown(&hashes, &keys, b"h", 300);
        let All::Streamed { mut stream, .. } =
            hashes.read_all(&keys, b"h", Part::Both, 1000).unwrap()
        else {
            panic!("not streamed");
        };
        hashes.next_part(&keys, &mut stream, 1000).unwrap().unwrap();
        change(&hashes, &keys);
        assert_eq!(stream_all(&hashes, &keys, stream, 1000), None, "change {n}");
        hashes.delete_key(&keys, b"h").unwrap();
        // Unchanged, the same read goes through.
        grown(&hashes, &keys, b"h", 300);
        let All::Streamed { stream, .. } = hashes.read_all(&keys, b"h", Part::Both, 1000).unwrap()
        else {
            panic!("not streamed");
        };
        assert_eq!(stream_all(&hashes, &keys, stream, 1000).unwrap().len(), 300);
        hashes.delete_key(&keys, b"h").unwrap();
    }
}

/// Numbers below `n`, the same from the same seed (xorshift).
struct Draws(u64);

impl Draws {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Waits up to 10 s for `thread` to finish; whether it did.
fn finishes<T>(thread: &std::thread::JoinHandle<T>) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !thread.is_finished() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    thread.is_finished()
}

/// Waits a while with `held` held, checks `thread` is still waiting for it, lets it go;
/// what `thread` returns.
fn waits_while_held<G, T>(held: G, thread: std::thread::JoinHandle<T>, why: &str) -> T {
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert!(!thread.is_finished(), "{why}");
    drop(held);
    thread.join().unwrap()
}

/// HGET, HGETALL, HLEN and HTTL of a packed hash take no lock: it is one object, read
/// whole at once (readers of one hot session on both serving threads queued on the
/// stripe lock).
#[test]
fn a_packed_hash_is_read_without_the_lock() {
    let keys = Arc::new(keyspace(8 << 20));
    let hashes = Arc::new(Hashes::default());
    hashes
        .set(&keys, b"s", &[b"a", b"1", b"b", b"2"], false)
        .unwrap();
    let held = hashes.lock(b"s");
    let (k, h) = (keys.clone(), hashes.clone());
    let reader = std::thread::spawn(move || {
        (
            h.get(&k, b"s", &[b"b", b"c"], 1 << 20).unwrap(),
            h.all(&k, b"s", Part::Both, 1 << 20).unwrap(),
            h.field_expiries(&k, b"s", &[b"a"]).unwrap(),
            h.len(&k, b"s").unwrap(),
        )
    });
    let finished = finishes(&reader);
    drop(held);
    assert!(finished, "a read of a packed hash waited for the lock");
    let (values, all, expiries, len) = reader.join().unwrap();
    assert_eq!(len, 2);
    assert_eq!(values, Some(vec![Some(b"2".to_vec()), None]));
    assert_eq!(all, pairs(&[("a", "1"), ("b", "2")]));
    assert_eq!(expiries, vec![Some(None)]);
}

/// HSET and HINCRBY of a packed hash (or of none) run in one engine update of
/// its header, the header not read by a GET first; a command that grows the hash past a
/// packed one, or names more fields than one holds, goes on the general way.
#[test]
fn a_packed_hash_is_written_in_one_engine_update() {
    let keys = keyspace(8 << 20);
    let hashes = Hashes::default();
    let gets = || keys.engine().stats().gets;
    let before = gets();
    hashes
        .set(&keys, b"s", &[b"a", b"1", b"b", b"2"], false)
        .unwrap();
    hashes.set(&keys, b"s", &[b"a", b"3"], false).unwrap();
    let n = hashes.update_field(&keys, b"s", b"n", |_| Ok::<_, ()>(b"5".to_vec()));
    assert_eq!(n.unwrap().unwrap(), b"5".to_vec());
    assert_eq!(
        gets(),
        before,
        "a packed hash's header read before its update"
    );
    assert_eq!(
        hashes.all(&keys, b"s", Part::Both, 1 << 20).unwrap(),
        pairs(&[("a", "3"), ("b", "2"), ("n", "5")])
    );
    grown(&hashes, &keys, b"s", 200);
    assert!(matches!(layout(&hashes, &keys, b"s"), Layout::Elements(_)));
    assert_eq!(hashes.len(&keys, b"s").unwrap(), 203);
}

/// A command on one field of a large hash shares the stripe lock (`one_field.rs`): it
/// runs while another holds the lock shared, and waits while one holds it alone; a
/// command on several fields, or one reading the hash whole, waits for the shared
/// holders. A command on one field of a packed hash takes the lock alone.
#[test]
fn commands_on_one_field_of_a_large_hash_share_its_lock() {
    let keys = Arc::new(keyspace(8 << 20));
    let hashes = Arc::new(Hashes::default());
    grown(&hashes, &keys, b"h", 200);
    let shared = hashes.lock_shared(b"h");
    let (k, h) = (keys.clone(), hashes.clone());
    let one = std::thread::spawn(move || {
        let added = h.set(&k, b"h", &[b"new", b"1"], false).unwrap();
        let n = h.update_field(&k, b"h", b"n", |_| Ok::<_, ()>(b"5".to_vec()));
        let deleted = h.delete_fields(&k, b"h", &[b"f000"]).unwrap();
        (added, n.unwrap().unwrap(), deleted)
    });
    assert!(
        finishes(&one),
        "a command on one field waited for a shared holder"
    );
    assert_eq!(one.join().unwrap(), (1, b"5".to_vec(), 1));
    let (k, h) = (keys.clone(), hashes.clone());
    let read = std::thread::spawn(move || h.get(&k, b"h", &[b"new"], 1 << 20));
    assert!(
        finishes(&read),
        "a read of one field waited for a shared holder"
    );
    assert_eq!(
        read.join().unwrap().unwrap(),
        Some(vec![Some(b"1".to_vec())])
    );
    let (k, h) = (keys.clone(), hashes.clone());
    let several = std::thread::spawn(move || h.set(&k, b"h", &[b"a", b"1", b"b", b"2"], false));
    let (k, h) = (keys.clone(), hashes.clone());
    let whole = std::thread::spawn(move || h.len(&k, b"h"));
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert!(!several.is_finished() && !whole.is_finished());
    drop(shared);
    assert_eq!(several.join().unwrap().unwrap(), 2);
    // 200, one set, one incremented, one deleted; and two more if `several` ran first.
    assert!(matches!(whole.join().unwrap().unwrap(), 201 | 203));

    let alone = hashes.lock(b"h");
    let (k, h) = (keys.clone(), hashes.clone());
    let one = std::thread::spawn(move || h.set(&k, b"h", &[b"late", b"1"], false));
    let why = "a command on one field ran beside a holder alone";
    assert_eq!(waits_while_held(alone, one, why).unwrap(), 1);
    let alone = hashes.lock(b"h");
    let (k, h) = (keys.clone(), hashes.clone());
    let read = std::thread::spawn(move || h.get(&k, b"h", &[b"late"], 1 << 20));
    let why = "a read of one field ran beside a holder alone";
    assert_eq!(
        waits_while_held(alone, read, why).unwrap(),
        Some(vec![Some(b"1".to_vec())])
    );

    // A large hash only read (as after a restart) is remembered by its first read.
    let hashes = Arc::new(Hashes::default());
    assert_eq!(
        hashes.get(&keys, b"h", &[b"late"], 1 << 20).unwrap(),
        Some(vec![Some(b"1".to_vec())])
    );
    let shared = hashes.lock_shared(b"h");
    let (k, h) = (keys.clone(), hashes.clone());
    let read = std::thread::spawn(move || h.get(&k, b"h", &[b"f001"], 1 << 20));
    let finished = finishes(&read);
    drop(shared);
    assert!(finished, "a large hash read was not remembered");
    assert_eq!(
        read.join().unwrap().unwrap(),
        Some(vec![Some(b"v".to_vec())])
    );

    hashes.set(&keys, b"p", &[b"a", b"1"], false).unwrap();
    let shared = hashes.lock_shared(b"p");
    let (k, h) = (keys.clone(), hashes.clone());
    let packed = std::thread::spawn(move || h.set(&k, b"p", &[b"b", b"2"], false));
    let why = "a packed hash's field written beside a shared holder";
    assert_eq!(waits_while_held(shared, packed, why).unwrap(), 1);
}

/// A stripe remembers the large hash it met last, and a command on one of its fields
/// uses that id without reading the header first (`one_field.rs`): replaced since — by a
/// string, or by another hash renamed over it — the id is found stale after the element
/// was read or written, and the command answers from what the key holds now.
#[test]
fn a_remembered_large_hash_replaced_since_is_never_read() {
    let keys = keyspace(8 << 20);
    let hashes = Hashes::default();
    let get = |key: &[u8], field: &[u8]| hashes.get(&keys, key, &[field], usize::MAX);
    let names: Vec<Vec<u8>> = (0..200).map(|i| format!("f{i:03}").into_bytes()).collect();
    let of_src: Vec<&[u8]> = names.iter().flat_map(|n| [n.as_slice(), b"src"]).collect();
    hashes.set(&keys, b"src", &of_src, false).unwrap();
    grown(&hashes, &keys, b"h", 200);
    assert_eq!(
        hashes.set(&keys, b"h", &[b"f000", b"old"], false).unwrap(),
        0
    );
    let old = elements_header(&hashes, &keys, b"h");
    hashes.rename(&keys, b"src", b"h", false).unwrap();
    assert_ne!(elements_header(&hashes, &keys, b"h").id, old.id);
    // A write through the stale id, then a read.
    assert_eq!(hashes.set(&keys, b"h", &[b"f001", b"x"], false).unwrap(), 0);
    assert_eq!(get(b"h", b"f001").unwrap(), Some(vec![Some(b"x".to_vec())]));
    assert_eq!(hashes.len(&keys, b"h").unwrap(), 200);
    hashes.rename(&keys, b"h", b"src", false).unwrap();
    hashes.rename(&keys, b"src", b"h", false).unwrap();
    assert_eq!(
        get(b"h", b"f000").unwrap(),
        Some(vec![Some(b"src".to_vec())])
    );

    // Made large again, remembered, then a string written over it (no stripe lock).
    grown(&hashes, &keys, b"s", 200);
    assert_eq!(
        hashes.set(&keys, b"s", &[b"f000", b"old"], false).unwrap(),
        0
    );
    keys.put_with(b"s", b"a string", zipcache::PutOptions::default())
        .unwrap();
    assert!(matches!(get(b"s", b"f000"), Err(HashError::WrongType)));
    let incremented = hashes.update_field(&keys, b"s", b"f000", |_| Ok::<_, ()>(b"1".to_vec()));
    assert!(matches!(incremented, Err(HashError::WrongType)));
    keys.delete(b"s").unwrap();
    assert_eq!(get(b"s", b"f000").unwrap(), None);
}

/// Threads writing one large hash field by field (HSET, HINCRBY, HDEL, HSETNX) beside
/// commands on several fields and whole reads: no whole read ever finds it partial (a
/// miscount between a field's change and its header's would drop the hash), its count
/// always matches its fields, and every increment is kept.
#[test]
fn threads_writing_one_large_hash_field_by_field_keep_it_whole() {
    const THREADS: usize = 4;
    const ROUNDS: usize = 3_000;
    let keys = Arc::new(keyspace(64 << 20));
    let hashes = Arc::new(Hashes::default());
    grown(&hashes, &keys, b"h", 200);
    let writers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (keys, hashes) = (keys.clone(), hashes.clone());
            std::thread::spawn(move || {
                let mut rng = Draws(t as u64 + 1);
                for round in 0..ROUNDS {
                    let field = format!("d{}", rng.below(64)).into_bytes();
                    match rng.below(5) {
                        0 => drop(hashes.set(&keys, b"h", &[&field, b"x"], false).unwrap()),
                        1 => drop(hashes.delete_fields(&keys, b"h", &[&field]).unwrap()),
                        2 => drop(hashes.set(&keys, b"h", &[&field, b"y"], true).unwrap()),
                        3 => {
                            let pairs: [&[u8]; 4] = [&field, b"z", b"d0", b"w"];
                            hashes.set(&keys, b"h", &pairs, false).unwrap();
                        }
                        _ => {
                            let total = hashes.update_field(&keys, b"h", b"total", |old| {
                                let old = old.map_or(0, |v| {
                                    std::str::from_utf8(v).unwrap().parse::<u64>().unwrap()
                                });
                                Ok::<_, ()>((old + 1).to_string().into_bytes())
                            });
                            total.unwrap().unwrap();
                        }
                    }
                    if round % 50 == 0 {
                        let all = hashes.all(&keys, b"h", Part::Both, 1 << 24).unwrap();
                        let len = hashes.len(&keys, b"h").unwrap();
                        assert!(all.len() >= 200, "a whole read found the hash partial");
                        assert!(len >= 200, "HLEN found the hash partial");
                    }
                }
            })
        })
        .collect();
    for writer in writers {
        writer.join().unwrap();
    }
    let all = hashes.all(&keys, b"h", Part::Both, 1 << 24).unwrap();
    assert_eq!(hashes.len(&keys, b"h").unwrap(), all.len() as u64);
    assert_eq!(
        elements_header(&hashes, &keys, b"h").elements,
        all.len() as u64
    );
    let increments = all
        .iter()
        .find(|(f, _)| f == b"total")
        .map(|(_, v)| v.clone());
    let counted = (0..THREADS)
        .map(|t| {
            let mut rng = Draws(t as u64 + 1);
            (0..ROUNDS)
                .filter(|_| {
                    rng.below(64);
                    rng.below(5) == 4
                })
                .count()
        })
        .sum::<usize>();
    assert_eq!(increments, Some(counted.to_string().into_bytes()));
}

proptest::proptest! {
    /// `repack` (a merge of a packed hash's fields, in name order, with a command's
    /// changes, in any order) leaves what a map by name would: a change to a live value
    /// sets its field, any other removes it, and a field that expired and was not
    /// changed is dropped.
    #[test]
    fn repacking_is_a_map_by_name(
        fields in proptest::collection::btree_map(
            proptest::collection::vec(0u8..6, 1..3),
            (proptest::collection::vec(proptest::prelude::any::<u8>(), 0..4), proptest::option::of(0u64..5)),
            0..10,
        ),
        changes in proptest::collection::btree_map(
            proptest::collection::vec(0u8..6, 1..3),
            (0u8..3, proptest::collection::vec(proptest::prelude::any::<u8>(), 0..4), proptest::option::of(3u64..6)),
            0..10,
        ),
        turn in 0usize..10,
    ) {
        let now_ms = 2;
        let packed = |name: &Vec<u8>, (value, expires_at_ms): &(Vec<u8>, Option<u64>)| Packed {
            name: name.clone(),
            value: value.clone(),
            expires_at_ms: *expires_at_ms,
        };
        let mut model: std::collections::BTreeMap<Vec<u8>, Packed> = fields
            .iter()
            .filter(|(_, (_, at))| at.is_none_or(|at| at > now_ms))
            .map(|(name, field)| (name.clone(), packed(name, field)))
            .collect();
        let mut edits: Vec<(Vec<u8>, Field, Field)> = changes
            .iter()
            .map(|(name, (kind, value, at))| {
                let after = match kind {
                    0 => Field::Live { value: value.clone(), expires_at_ms: *at },
                    1 => Field::Absent,
                    _ => Field::Dead { had_expiry: at.is_some() },
                };
                match &after {
                    Field::Live { .. } => model.insert(name.clone(), packed(name, &(value.clone(), *at))),
                    _ => model.remove(name),
                };
                (name.clone(), Field::Absent, after)
            })
            .collect();
        let len = edits.len();
        edits.rotate_left(turn.min(len));
        let fields: Vec<Packed> = fields.iter().map(|(n, f)| packed(n, f)).collect();
        let expected: Vec<Packed> = model.into_values().collect();
        match repack(fields, edits, now_ms, usize::MAX) {
            Repacked::Empty => proptest::prop_assert!(expected.is_empty()),
            Repacked::Packed(bytes) => proptest::prop_assert_eq!(bytes, format::packed_bytes(&expected)),
            Repacked::Grown(_) => proptest::prop_assert!(false, "{} fields grew", expected.len()),
        }
    }
}
