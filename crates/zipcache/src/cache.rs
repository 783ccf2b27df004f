//! INTERIM (replaced by the tiered engine in this same session): the public API over a
//! locked BTreeMap so the server and bench crates can be built against the real API.

use std::collections::BTreeMap;
use std::ops::{Bound, RangeBounds};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use crate::{Config, Error, Item, PutOptions, Result, Stats, Update};

pub struct ZipCache {
    config: Config,
    map: Mutex<BTreeMap<Vec<u8>, Item>>,
    next_cas: AtomicU64,
}

impl ZipCache {
    pub fn open(config: Config) -> Result<ZipCache> {
        config.validate()?;
        Ok(ZipCache {
            config,
            map: Mutex::new(BTreeMap::new()),
            next_cas: AtomicU64::new(1),
        })
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn now_ms(&self) -> u64 {
        self.config.clock.now_ms()
    }

    fn check_key(&self, key: &[u8]) -> Result<()> {
        if key.is_empty() {
            return Err(Error::EmptyKey);
        }
        if key.len() > self.config.max_key_size {
            return Err(Error::KeyTooLarge {
                len: key.len(),
                max: self.config.max_key_size,
            });
        }
        Ok(())
    }

    fn check_value(&self, value: &[u8]) -> Result<()> {
        if value.len() > self.config.max_value_size {
            return Err(Error::ValueTooLarge {
                len: value.len(),
                max: self.config.max_value_size,
            });
        }
        Ok(())
    }

    fn live(&self, item: &Item) -> bool {
        item.expires_at_ms.is_none_or(|t| t > self.now_ms())
    }

    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.get_item(key)?.map(|i| i.value))
    }

    pub fn get_item(&self, key: &[u8]) -> Result<Option<Item>> {
        self.check_key(key)?;
        Ok(self.map.lock().get(key).filter(|i| self.live(i)).cloned())
    }

    pub fn put(&self, key: &[u8], value: &[u8], ttl: Option<Duration>) -> Result<()> {
        let expires_at_ms = ttl.map(|d| self.now_ms().saturating_add(d.as_millis() as u64));
        self.put_with(
            key,
            value,
            PutOptions {
                expires_at_ms,
                ..PutOptions::default()
            },
        )?;
        Ok(())
    }

    pub fn put_with(&self, key: &[u8], value: &[u8], options: PutOptions) -> Result<u64> {
        self.check_key(key)?;
        self.check_value(value)?;
        let cas = if options.assign_cas {
            self.next_cas.fetch_add(1, Ordering::Relaxed)
        } else {
            0
        };
        let item = Item {
            value: value.to_vec(),
            flags: options.flags,
            cas,
            expires_at_ms: options.expires_at_ms,
        };
        self.map.lock().insert(key.to_vec(), item);
        Ok(cas)
    }

    pub fn delete(&self, key: &[u8]) -> Result<bool> {
        self.check_key(key)?;
        Ok(self.map.lock().remove(key).is_some_and(|i| self.live(&i)))
    }

    pub fn update<R>(
        &self,
        key: &[u8],
        f: impl FnOnce(Option<&Item>) -> (Update, R),
    ) -> Result<(R, Option<u64>)> {
        self.check_key(key)?;
        let mut map = self.map.lock();
        let current = map.get(key).filter(|i| self.live(i)).cloned();
        let (update, r) = f(current.as_ref());
        match update {
            Update::Keep => Ok((r, None)),
            Update::Delete => {
                map.remove(key);
                Ok((r, None))
            }
            Update::Put { value, options } => {
                self.check_value(&value)?;
                let cas = if options.assign_cas {
                    self.next_cas.fetch_add(1, Ordering::Relaxed)
                } else {
                    0
                };
                map.insert(
                    key.to_vec(),
                    Item {
                        value,
                        flags: options.flags,
                        cas,
                        expires_at_ms: options.expires_at_ms,
                    },
                );
                Ok((r, Some(cas)))
            }
        }
    }

    pub fn scan<K: AsRef<[u8]>>(
        &self,
        range: impl RangeBounds<K>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Item)>> {
        let conv = |b: Bound<&K>| match b {
            Bound::Included(k) => Bound::Included(k.as_ref().to_vec()),
            Bound::Excluded(k) => Bound::Excluded(k.as_ref().to_vec()),
            Bound::Unbounded => Bound::Unbounded,
        };
        let map = self.map.lock();
        Ok(map
            .range((conv(range.start_bound()), conv(range.end_bound())))
            .filter(|(_, i)| self.live(i))
            .take(limit)
            .map(|(k, i)| (k.clone(), i.clone()))
            .collect())
    }

    pub fn flush_all(&self) -> Result<()> {
        self.map.lock().clear();
        Ok(())
    }

    pub fn set_bypass_r(&self, _r: f64) {}

    pub fn stats(&self) -> Stats {
        let n = self.map.lock().len() as u64;
        Stats {
            dram_capacity: self.config.dram_capacity,
            objects_resident: n,
            dram_objects: n,
            ..Stats::default()
        }
    }

    pub fn close(self) -> Result<()> {
        Ok(())
    }
}
