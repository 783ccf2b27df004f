//! Hashes against a model (`BTreeMap` of `BTreeMap`s), with evictions forced by a small
//! DRAM budget — DRAM-only, where evicted elements are dropped, and with an SSD tier,
//! where they move to flash — and restarts, clean and cut short (the engine dropped
//! without its close). A cache may forget: a whole hash, a field, a string. It may never
//! answer with a value the model does not hold, a hash with some of its fields missing,
//! or a string where a hash is (or the other way round).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use proptest::prelude::*;
use zipcache::config::DeviceCompression;
use zipcache::{Config, GetOptions, PutOptions, SsdConfig, ZipCache};

use super::*;

#[derive(Clone, Debug)]
enum Op {
    Set {
        key: u8,
        pairs: Vec<(u8, u16)>,
    },
    Delete {
        key: u8,
        fields: Vec<u8>,
    },
    Incr {
        key: u8,
        field: u8,
        by: i8,
    },
    DelKey {
        key: u8,
    },
    String {
        key: u8,
        value: u16,
    },
    GetAll {
        key: u8,
    },
    Get {
        key: u8,
        fields: Vec<u8>,
    },
    Len {
        key: u8,
    },
    Expire {
        key: u8,
        field: u8,
    },
    /// Writes filler strings until DRAM has evicted.
    Fill {
        n: u16,
    },
    Restart {
        clean: bool,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0u8..12;
    let field = 0u8..24;
    prop_oneof![
        6 => (key.clone(), prop::collection::vec((field.clone(), any::<u16>()), 1..8))
            .prop_map(|(key, pairs)| Op::Set { key, pairs }),
        2 => (key.clone(), prop::collection::vec(field.clone(), 1..4))
            .prop_map(|(key, fields)| Op::Delete { key, fields }),
        1 => (key.clone(), field.clone(), any::<i8>()).prop_map(|(key, field, by)| Op::Incr { key, field, by }),
        1 => key.clone().prop_map(|key| Op::DelKey { key }),
        1 => (key.clone(), any::<u16>()).prop_map(|(key, value)| Op::String { key, value }),
        4 => key.clone().prop_map(|key| Op::GetAll { key }),
        3 => (key.clone(), prop::collection::vec(field.clone(), 1..4))
            .prop_map(|(key, fields)| Op::Get { key, fields }),
        2 => key.clone().prop_map(|key| Op::Len { key }),
        1 => (key.clone(), field).prop_map(|(key, field)| Op::Expire { key, field }),
        2 => (500u16..4000).prop_map(|n| Op::Fill { n }),
        1 => any::<bool>().prop_map(|clean| Op::Restart { clean }),
    ]
}

#[derive(Clone, Debug, PartialEq)]
enum Held {
    Hash(BTreeMap<Vec<u8>, Vec<u8>>),
    String(Vec<u8>),
}

/// Whether the engine holds a hash at `key`: if not, the model's was forgotten whole,
/// and a write makes a new one that holds only what was written since.
fn held(hashes: &Hashes, keys: &Keyspace, key: u8) -> bool {
    hashes.header(keys, &key_of(key)).ok().flatten().is_some()
}

/// The model's hash at `key` as a write that found (`found`) or did not find the
/// engine's hash builds on.
fn base(model: &mut BTreeMap<u8, Held>, key: u8, found: bool) -> BTreeMap<Vec<u8>, Vec<u8>> {
    match model.remove(&key) {
        Some(Held::Hash(hash)) if found => hash,
        _ => BTreeMap::new(),
    }
}

fn key_of(key: u8) -> Vec<u8> {
    format!("session:{key:03}").into_bytes()
}

/// Field names as sessions have them, repeated across hashes.
fn field_of(field: u8) -> Vec<u8> {
    format!("attribute-{field:02}").into_bytes()
}

/// Values long enough that a hash of a few fields fills part of a page; those of the
/// keys above 5 long enough that their hashes outgrow the packed layout.
fn value_of(key: u8, value: u16) -> Vec<u8> {
    let pad = usize::from(value % 64) + if key > 5 { 160 } else { 0 };
    format!("{value:05}-{}", "v".repeat(pad)).into_bytes()
}

fn open(dir: Option<&Path>) -> Keyspace {
    let config = Config {
        dram_capacity: 256 << 10,
        ssd: dir.map(|dir| SsdConfig {
            path: dir.join("ssd.bin"),
            size: 32 << 20,
            direct_io: false,
            device_compression: DeviceCompression::Emulate,
            logical_to_physical: 4.0,
        }),
        flush_wait_ms: 60_000,
        ..Config::default()
    };
    Keyspace::new(Arc::new(ZipCache::open(config).unwrap()), Arc::default())
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn temp_dir() -> TempDir {
    use std::sync::atomic::AtomicU32;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "zipcache-hash-model-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    TempDir(dir)
}

fn run(ops: &[Op], ssd: bool) -> std::result::Result<(), TestCaseError> {
    let dir = ssd.then(temp_dir);
    let path = dir.as_ref().map(|d| d.0.as_path());
    let mut keys = open(path);
    let mut hashes = Hashes::default();
    let mut model: BTreeMap<u8, Held> = BTreeMap::new();
    let mut fillers = 0u32;
    for (step, op) in ops.iter().enumerate() {
        match op.clone() {
            Op::Set { key, pairs } => {
                let pairs: Vec<(Vec<u8>, Vec<u8>)> = pairs
                    .iter()
                    .map(|&(f, v)| (field_of(f), value_of(key, v)))
                    .collect();
                let args: Vec<&[u8]> = pairs.iter().flat_map(|(f, v)| [&f[..], &v[..]]).collect();
                let found = held(&hashes, &keys, key);
                match hashes.set(&keys, &key_of(key), &args, false) {
                    Ok(_) => {
                        // A string the model holds may have been forgotten: then the
                        // write made a hash.
                        let mut hash = base(&mut model, key, found);
                        hash.extend(pairs);
                        model.insert(key, Held::Hash(hash));
                    }
                    Err(HashError::WrongType) => {
                        prop_assert!(
                            matches!(model.get(&key), Some(Held::String(_))),
                            "step {step}: WRONGTYPE on {:?}",
                            model.get(&key)
                        );
                    }
                    Err(e) => return Err(TestCaseError::fail(format!("step {step}: {e:?}"))),
                }
            }
            Op::Delete { key, fields } => {
                let names: Vec<Vec<u8>> = fields.iter().map(|&f| field_of(f)).collect();
                let refs: Vec<&[u8]> = names.iter().map(Vec::as_slice).collect();
                let found = held(&hashes, &keys, key);
                match hashes.delete_fields(&keys, &key_of(key), &refs) {
                    Ok(deleted) => {
                        if let Some(Held::Hash(hash)) = model.get_mut(&key) {
                            if !found {
                                hash.clear();
                            }
                            let mut held = 0;
                            for name in &names {
                                held += u64::from(hash.remove(name).is_some());
                            }
                            prop_assert!(
                                deleted <= held,
                                "step {step}: {deleted} deleted of {held}"
                            );
                            if hash.is_empty() {
                                model.remove(&key);
                            }
                        } else {
                            prop_assert_eq!(deleted, 0, "step {}", step);
                        }
                    }
                    Err(HashError::WrongType) => {
                        prop_assert!(matches!(model.get(&key), Some(Held::String(_))));
                    }
                    Err(e) => return Err(TestCaseError::fail(format!("step {step}: {e:?}"))),
                }
            }
            Op::Incr { key, field, by } => {
                let name = field_of(field);
                let found = held(&hashes, &keys, key);
                let result = hashes.update_field(&keys, &key_of(key), &name, |old| {
                    let old: i64 = match old {
                        None => 0,
                        Some(text) => {
                            match std::str::from_utf8(text).ok().and_then(|t| t.parse().ok()) {
                                Some(n) => n,
                                None => return Err(()),
                            }
                        }
                    };
                    Ok((old + i64::from(by)).to_string().into_bytes())
                });
                match result {
                    Ok(Ok(new)) => {
                        let hash = base(&mut model, key, found);
                        // A forgotten field restarts at 0: the new value is by, or the
                        // model's plus by.
                        let expected = match hash.get(&name) {
                            Some(old) => std::str::from_utf8(old)
                                .ok()
                                .and_then(|t| t.parse::<i64>().ok()),
                            None => Some(0),
                        };
                        let got: i64 = std::str::from_utf8(&new).unwrap().parse().unwrap();
                        prop_assert!(
                            expected.is_some_and(|e| e + i64::from(by) == got)
                                || got == i64::from(by),
                            "step {step}: {got} from {:?}",
                            hash.get(&name)
                        );
                        let mut hash = hash;
                        hash.insert(name, new);
                        model.insert(key, Held::Hash(hash));
                    }
                    Ok(Err(())) => {
                        let old = match model.get(&key) {
                            Some(Held::Hash(hash)) => hash.get(&name).cloned(),
                            _ => None,
                        };
                        prop_assert!(
                            old.is_some_and(|v| std::str::from_utf8(&v)
                                .ok()
                                .and_then(|t| t.parse::<i64>().ok())
                                .is_none()),
                            "step {step}: not an integer, but the model holds {:?}",
                            model.get(&key)
                        );
                    }
                    Err(HashError::WrongType) => {
                        prop_assert!(matches!(model.get(&key), Some(Held::String(_))));
                    }
                    Err(e) => return Err(TestCaseError::fail(format!("step {step}: {e:?}"))),
                }
            }
            Op::DelKey { key } => {
                hashes.delete_key(&keys, &key_of(key)).unwrap();
                model.remove(&key);
            }
            Op::String { key, value } => {
                keys.put_with(&key_of(key), &value_of(key, value), PutOptions::default())
                    .unwrap();
                model.insert(key, Held::String(value_of(key, value)));
            }
            Op::GetAll { key } => match hashes.all(&keys, &key_of(key), Part::Both, usize::MAX) {
                Ok(pairs) => {
                    let got: BTreeMap<Vec<u8>, Vec<u8>> = pairs.into_iter().collect();
                    match model.get(&key) {
                        Some(Held::Hash(_)) if got.is_empty() => {
                            model.remove(&key);
                        }
                        Some(Held::Hash(hash)) => {
                            prop_assert_eq!(&got, hash, "step {}: a hash whole or not at all", step)
                        }
                        Some(Held::String(_)) => {
                            // The string was forgotten: nothing, never some hash.
                            prop_assert!(got.is_empty(), "step {step}: a hash where a string was");
                            model.remove(&key);
                        }
                        None => prop_assert!(got.is_empty(), "step {step}: {got:?} from nothing"),
                    }
                }
                Err(HashError::WrongType) => {
                    prop_assert!(matches!(model.get(&key), Some(Held::String(_))));
                }
                Err(e) => return Err(TestCaseError::fail(format!("step {step}: {e:?}"))),
            },
            Op::Get { key, fields } => {
                let names: Vec<Vec<u8>> = fields.iter().map(|&f| field_of(f)).collect();
                let refs: Vec<&[u8]> = names.iter().map(Vec::as_slice).collect();
                match hashes.get(&keys, &key_of(key), &refs, usize::MAX) {
                    Ok(Some(values)) => {
                        let Some(Held::Hash(hash)) = model.get(&key) else {
                            return Err(TestCaseError::fail(format!(
                                "step {step}: a hash where the model holds {:?}",
                                model.get(&key)
                            )));
                        };
                        for (name, value) in names.iter().zip(values) {
                            if let Some(value) = value {
                                prop_assert_eq!(Some(&value), hash.get(name), "step {}", step);
                            }
                        }
                    }
                    Ok(None) => {
                        if matches!(model.get(&key), Some(Held::String(_))) {
                            model.remove(&key);
                        }
                    }
                    Err(HashError::WrongType) => {
                        prop_assert!(matches!(model.get(&key), Some(Held::String(_))));
                    }
                    Err(e) => return Err(TestCaseError::fail(format!("step {step}: {e:?}"))),
                }
                // A string read through the string view is the model's or nothing.
                let item = keys
                    .strings_only()
                    .get_item(&key_of(key), GetOptions::default())
                    .unwrap();
                if let Some(item) = item {
                    prop_assert_eq!(
                        Some(&Held::String(item.value)),
                        model.get(&key),
                        "step {}",
                        step
                    );
                }
            }
            Op::Len { key } => match hashes.len(&keys, &key_of(key)) {
                Ok(len) => match model.get(&key) {
                    Some(Held::Hash(_)) if len == 0 => {
                        model.remove(&key);
                    }
                    Some(Held::Hash(hash)) => {
                        prop_assert_eq!(len, hash.len() as u64, "step {}", step)
                    }
                    _ => prop_assert_eq!(len, 0, "step {}", step),
                },
                Err(HashError::WrongType) => {
                    prop_assert!(matches!(model.get(&key), Some(Held::String(_))));
                }
                Err(e) => return Err(TestCaseError::fail(format!("step {step}: {e:?}"))),
            },
            Op::Expire { key, field } => {
                // A field expired at once (a time already past) is gone.
                let name = field_of(field);
                let past = keys.engine().now_ms();
                let found = held(&hashes, &keys, key);
                match hashes.expire_fields(
                    &keys,
                    &key_of(key),
                    &[&name],
                    past,
                    ExpiryCondition::Always,
                ) {
                    Ok(codes) => {
                        if let Some(Held::Hash(hash)) = model.get_mut(&key) {
                            if !found {
                                hash.clear();
                            }
                            let held = hash.remove(&name).is_some();
                            prop_assert!(
                                codes[0] == NO_FIELD || (held && codes[0] == 2),
                                "step {step}: {codes:?}"
                            );
                            if hash.is_empty() {
                                model.remove(&key);
                            }
                        } else {
                            prop_assert_eq!(codes[0], NO_FIELD, "step {}", step);
                        }
                    }
                    Err(HashError::WrongType) => {
                        prop_assert!(matches!(model.get(&key), Some(Held::String(_))));
                    }
                    Err(e) => return Err(TestCaseError::fail(format!("step {step}: {e:?}"))),
                }
            }
            Op::Fill { n } => {
                for _ in 0..n {
                    fillers += 1;
                    let key = format!("~filler:{fillers:08}");
                    let value = format!(
                        "{:064x}",
                        u64::from(fillers).wrapping_mul(0x9E37_79B9_7F4A_7C15)
                    );
                    keys.put_with(key.as_bytes(), value.as_bytes(), PutOptions::default())
                        .unwrap();
                }
            }
            Op::Restart { clean } => {
                let engine = keys.engine().clone();
                drop(keys);
                let engine = Arc::try_unwrap(engine).ok().expect("the only handle");
                if clean {
                    engine.close().unwrap();
                } else {
                    drop(engine);
                }
                keys = open(path);
                hashes = Hashes::default();
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn hashes_match_the_model_dram_only(ops in prop::collection::vec(op(), 1..160)) {
        run(&ops, false)?;
    }

    #[test]
    fn hashes_match_the_model_with_an_ssd_tier_and_restarts(ops in prop::collection::vec(op(), 1..160)) {
        run(&ops, true)?;
    }
}
