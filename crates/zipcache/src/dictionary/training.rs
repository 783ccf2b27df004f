//! Which dictionary the engine compresses new medium objects with, and how it gets one:
//! a reservoir sample of recent medium values, trained in the background into a
//! candidate that replaces the current dictionary only if a held-out part of the sample
//! compresses noticeably better with it.
//!
//! The sample is a reservoir over a window of writes (every value of the window equally
//! likely to be in it, whatever the window's length), bounded in count and in bytes a
//! value, and charged to the DRAM budget. The first window is as long as the reservoir
//! (the first dictionary comes early); after a swap the next window is
//! [`WINDOW_AFTER_SWAP`] reservoirs long, and after a candidate that did not win twice
//! as long as the last, up to [`LONGEST_WINDOW`], so a changed schema gets a new
//! dictionary within a few windows.
//!
//! A window trains a candidate only if the values have drifted: while the current
//! dictionary compresses the window's held-out values about as well as it compressed
//! those of the window it was trained on, no candidate would beat it by the margin a swap
//! needs, and training one (fastCover over the reservoir, a few tens of milliseconds) is
//! most of what a stationary fill spends on dictionaries. Judging the window costs a
//! compression of its held-out samples; a window that fits is followed by one twice as
//! long, up to [`LONGEST_FITTED_WINDOW`] reservoirs.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwapOption;
use parking_lot::Mutex;

use crate::memory::{Memory, alloc_size};

/// A candidate replaces the current dictionary if the held-out values take at most this
/// fraction of what they take with the current one (or with none).
const SWAP_BELOW: f64 = 0.95;
/// One sample in this many is held out of training, to judge the candidate.
const HELD_OUT_EVERY: usize = 8;
/// Windows, in reservoirs: after a swap, and the longest.
const WINDOW_AFTER_SWAP: u64 = 8;
const LONGEST_WINDOW: u64 = 256;
/// The longest window after one the current dictionary fitted, in reservoirs: values
/// that drift are found within it. Shorter windows copy more values into the
/// reservoir (a third of them at 8 reservoirs, a quarter at 16).
const LONGEST_FITTED_WINDOW: u64 = 16;

/// How large the reservoir and the dictionary are for a DRAM budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TrainingSettings {
    pub samples: usize,
    pub dictionary_size: usize,
}

/// The smallest DRAM budget that trains dictionaries of the size it chooses: a
/// dictionary's prepared forms take up to 0.3 MB (112 KiB at zstd level 1: the
/// compression dictionary's hash table and both copies of the dictionary), with the
/// reservoir (256 samples of up to 1 KiB at 8 MiB) up to 7 % of this budget; below it
/// they would crowd out the objects.
pub const MIN_BUDGET: u64 = 8 << 20;

/// Smallest and largest log2 of the buckets of zstd's trainer's d-mer table (fastCover's
/// `f`): `ZDICT_trainFromBuffer` always takes 2^20, 6 MiB of tables for a reservoir of a
/// few hundred KiB, outside the budget, twice over when both kinds train at once.
const TABLE_LOG: std::ops::RangeInclusive<u32> = 12..=20;
/// Bytes of fastCover's tables per bucket: a 4-byte frequency and a 2-byte segment count.
const TABLE_BYTES_PER_BUCKET: usize = 6;

/// The log2 of the buckets for `sample_bytes` of samples: one per 4 bytes. JSON fills
/// through the server (docs/RESULTS.md) held as many documents with it as with 2^20 or
/// with one per byte, and peaked 6–9 MiB lower than with 2^20.
fn table_log(sample_bytes: usize) -> u32 {
    (usize::BITS - (sample_bytes >> 2).leading_zeros()).clamp(*TABLE_LOG.start(), *TABLE_LOG.end())
}

/// What training `samples` into a dictionary of `size` bytes takes while it runs: the
/// samples laid end to end with their sizes, the trainer's tables and its output.
pub fn training_bytes(samples: &[&[u8]], size: usize) -> usize {
    let flat: usize = samples.iter().map(|s| s.len()).sum();
    alloc_size(flat)
        + alloc_size(samples.len() * size_of::<usize>())
        + (TABLE_BYTES_PER_BUCKET << table_log(flat))
        + alloc_size(size)
}

/// A dictionary of at most `size` bytes trained on `samples` by zstd's trainer (fastCover,
/// as `ZDICT_trainFromBuffer`: d = 8, four values of k tried), its table sized to the
/// samples; `None` where zstd refuses them (too few, too small).
pub fn train_from_samples(samples: &[&[u8]], size: usize) -> Option<Vec<u8>> {
    use zstd::zstd_safe::zstd_sys::{
        ZDICT_fastCover_params_t, ZDICT_isError, ZDICT_optimizeTrainFromBuffer_fastCover,
        ZDICT_params_t,
    };
    let flat = samples.concat();
    let sizes: Vec<usize> = samples.iter().map(|s| s.len()).collect();
    let count = u32::try_from(sizes.len()).ok()?;
    let mut params = ZDICT_fastCover_params_t {
        k: 0,
        d: 8,
        f: table_log(flat.len()),
        steps: 4,
        nbThreads: 0,
        splitPoint: 0.0,
        accel: 0,
        shrinkDict: 0,
        shrinkDictMaxRegression: 0,
        zParams: ZDICT_params_t {
            compressionLevel: 0,
            notificationLevel: 0,
            dictID: 0,
        },
    };
    let mut dictionary = vec![0u8; size];
    // SAFETY: every pointer is to a live buffer of the length passed beside it
    // (`dictionary` of `size` bytes; `flat` of the sum of `sizes`, `count` of them), and
    // `params` is a valid fastCover parameter block that zstd may write its choice into;
    // zstd keeps none of them after it returns. Tested by `trains_with_a_table_sized_to_the_samples`.
    let written = unsafe {
        ZDICT_optimizeTrainFromBuffer_fastCover(
            dictionary.as_mut_ptr().cast(),
            dictionary.len(),
            flat.as_ptr().cast(),
            sizes.as_ptr(),
            count,
            &mut params,
        )
    };
    // SAFETY: `ZDICT_isError` only inspects the value.
    if unsafe { ZDICT_isError(written) } != 0 {
        return None;
    }
    dictionary.truncate(written);
    Some(dictionary)
}

/// One kind of dictionary the engine trains: what it compresses, how it is trained from
/// samples of that, and how a sample set is judged.
pub trait Kind: Send + Sync + Sized + 'static {
    /// Bytes of an offered value a sample keeps.
    const SAMPLE_PREFIX: usize;

    /// A dictionary of about `size` bytes trained on `samples`, the `generation`-th this
    /// run trained of its kind (from 1), charged to `memory`.
    fn train(
        generation: u64,
        samples: &[&[u8]],
        size: usize,
        memory: Arc<Memory>,
    ) -> Option<Arc<Self>>;

    /// Bytes `held_out` take stored with `dictionary` (or none).
    fn cost(held_out: &[&[u8]], dictionary: Option<&Self>) -> usize;

    /// A first dictionary is taken if the held-out values take at most this fraction of
    /// what they take with none: a kind whose dictionary costs more CPU than going
    /// without asks for more than [`SWAP_BELOW`].
    const FIRST_BELOW: f64 = SWAP_BELOW;
}

#[derive(Debug, Default)]
pub struct TrainingCounters {
    /// Candidates trained.
    pub trained: AtomicU64,
    /// Candidates that became the current dictionary.
    pub swapped: AtomicU64,
    /// Windows the current dictionary still fitted: no candidate trained.
    pub fitted: AtomicU64,
}

/// The current dictionary of one kind, and the training that may replace it.
pub struct Trainer<K: Kind> {
    settings: TrainingSettings,
    current: ArcSwapOption<K>,
    reservoir: Mutex<Reservoir>,
    memory: Arc<Memory>,
    pub counters: TrainingCounters,
}

struct Reservoir {
    samples: Vec<Box<[u8]>>,
    /// Values offered in this window.
    seen: u64,
    /// Window length, in values.
    window: u64,
    /// SplitMix64 state for the reservoir's choices.
    rng: u64,
    /// Bytes charged for `samples`.
    charged: i64,
    training: Option<std::thread::JoinHandle<()>>,
    /// Candidates trained so far.
    generation: u64,
    /// What the current dictionary's held-out values took, over their raw bytes, when it
    /// was swapped in: a window's held-out values taking more than this by the swap's
    /// margin means the values drifted.
    fitted: Option<f64>,
}

impl<K: Kind> Trainer<K> {
    pub fn new(settings: TrainingSettings, memory: Arc<Memory>) -> Self {
        Trainer {
            settings,
            current: ArcSwapOption::empty(),
            reservoir: Mutex::new(Reservoir {
                samples: Vec::new(),
                seen: 0,
                window: settings.samples as u64,
                rng: 0x5eed,
                charged: 0,
                training: None,
                generation: 0,
                fitted: None,
            }),
            memory,
            counters: TrainingCounters::default(),
        }
    }

    /// The dictionary new data is compressed with, if there is one yet.
    pub fn current(&self) -> Option<Arc<K>> {
        self.current.load_full()
    }

    /// A value just written: it may join the reservoir, and a full window starts a
    /// training in the background (on its own thread).
    pub fn offer(self: &Arc<Self>, value: &[u8]) {
        self.offer_each([value], |value, sample| {
            sample.extend_from_slice(&value[..value.len().min(K::SAMPLE_PREFIX)]);
        });
    }

    /// `offer` for several values, under one lock, each written out by `write` only if
    /// the reservoir takes it: once a dictionary fits, most are not taken (a quarter of a
    /// window of 16 reservoirs), so the records merges and flushes offer need not all
    /// be encoded to be offered.
    pub fn offer_each<T>(
        self: &Arc<Self>,
        values: impl IntoIterator<Item = T>,
        mut write: impl FnMut(T, &mut Vec<u8>),
    ) {
        let mut r = self.reservoir.lock();
        let mut charged = 0;
        for value in values {
            if let Some(slot) = self.slot(&mut r) {
                // Written where it is kept: a medium PUT's value (`offer`, on a serving
                // thread) is copied once, into a buffer of its prefix's length.
                let mut sample = Vec::new();
                write(value, &mut sample);
                sample.truncate(K::SAMPLE_PREFIX);
                charged += keep(&mut r, slot, sample.into_boxed_slice());
            }
        }
        // Once for all: the budget's counters are shared with every thread's writes.
        if charged != 0 {
            r.charged += charged;
            self.memory.change_dictionaries(charged);
        }
        let busy = r.training.as_ref().is_some_and(|t| !t.is_finished());
        if r.seen >= r.window && !busy {
            let samples = std::mem::take(&mut r.samples);
            let charged = std::mem::take(&mut r.charged);
            r.seen = 0;
            r.generation += 1;
            let generation = r.generation;
            let this = self.clone();
            r.training = std::thread::Builder::new()
                .name("zipcache-dictionary".into())
                .spawn(move || this.train(generation, samples, charged))
                .ok();
        }
    }

    /// Reservoir sampling: the slot the window's next value takes, with the probability
    /// that keeps every value of the window equally likely to be in it, if any.
    fn slot(&self, r: &mut Reservoir) -> Option<usize> {
        r.seen += 1;
        if r.samples.len() < self.settings.samples {
            Some(r.samples.len())
        } else {
            r.rng = r.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let pick = (mix(r.rng) % r.seen) as usize;
            (pick < self.settings.samples).then_some(pick)
        }
    }

    /// Trains a candidate on `samples` (less those held out) unless the current
    /// dictionary still fits them, and makes it current if the held-out samples compress
    /// noticeably better with it.
    fn train(&self, generation: u64, samples: Vec<Box<[u8]>>, charged: i64) {
        let (held_out, training): (Vec<_>, Vec<_>) = samples
            .iter()
            .enumerate()
            .partition(|(i, _)| i % HELD_OUT_EVERY == 0);
        let training: Vec<&[u8]> = training.into_iter().map(|(_, s)| &s[..]).collect();
        // Judged only on values it did not learn: under churn a key is written again
        // within a window, and a copy of a training sample held out makes any candidate
        // look better than the current dictionary, swapped in every window.
        let learnt: std::collections::HashSet<&[u8]> = training.iter().copied().collect();
        let held_out: Vec<&[u8]> = held_out
            .into_iter()
            .map(|(_, s)| &s[..])
            .filter(|s| !learnt.contains(s))
            .collect();
        drop(learnt);
        let raw = held_out.iter().map(|s| s.len()).sum::<usize>().max(1) as f64;
        let current = self.current();
        let current_cost = K::cost(&held_out, current.as_deref()) as f64;
        let fitted = self.reservoir.lock().fitted;
        let fits = current.is_some()
            && !held_out.is_empty()
            && fitted.is_some_and(|f| current_cost / raw * SWAP_BELOW <= f);
        let swapped_in = if fits {
            self.counters.fitted.fetch_add(1, Ordering::Relaxed);
            None
        } else {
            self.candidate(generation, &training, &held_out, current_cost)
                .map(|(candidate, cost)| (candidate, cost / raw))
        };
        drop(held_out);
        drop(training);
        drop(samples);
        self.memory.change_dictionaries(-charged);
        let mut r = self.reservoir.lock();
        let reservoir = self.settings.samples as u64;
        if let Some((candidate, fitted)) = swapped_in {
            self.current.store(Some(candidate));
            r.fitted = Some(fitted);
            self.counters.swapped.fetch_add(1, Ordering::Relaxed);
            r.window = reservoir * WINDOW_AFTER_SWAP;
        } else if fits {
            r.window = (r.window * 2).clamp(reservoir, reservoir * LONGEST_FITTED_WINDOW);
        } else {
            r.window = (r.window * 2).clamp(reservoir, reservoir * LONGEST_WINDOW);
        }
    }

    /// A candidate trained on `training`, and what `held_out` take with it, if that is
    /// at most [`SWAP_BELOW`] of `current_cost` (what they take now; [`Kind::FIRST_BELOW`]
    /// with no current dictionary).
    fn candidate(
        &self,
        generation: u64,
        training: &[&[u8]],
        held_out: &[&[u8]],
        current_cost: f64,
    ) -> Option<(Arc<K>, f64)> {
        // The trainer's working memory is the budget's while it runs.
        let working = training_bytes(training, self.settings.dictionary_size) as i64;
        self.memory.change_dictionaries(working);
        let candidate = K::train(
            generation,
            training,
            self.settings.dictionary_size,
            self.memory.clone(),
        );
        self.memory.change_dictionaries(-working);
        self.counters.trained.fetch_add(1, Ordering::Relaxed);
        let candidate = candidate.filter(|_| !held_out.is_empty())?;
        let cost = K::cost(held_out, Some(&candidate)) as f64;
        let bar = if self.current().is_some() {
            SWAP_BELOW
        } else {
            K::FIRST_BELOW
        };
        (cost <= current_cost * bar).then_some((candidate, cost))
    }

    /// Makes `dictionary` the current one, as a swap would (a block dictionary loaded at
    /// open goes on being used: `ssd/dictionary.rs`).
    pub fn make_current(&self, dictionary: Option<Arc<K>>) {
        self.current.store(dictionary);
    }

    /// Values offered since the last training started.
    #[cfg(test)]
    pub fn offered(&self) -> u64 {
        self.reservoir.lock().seen
    }

    /// What the reservoir's samples are charged.
    #[cfg(test)]
    pub fn sample_charge(&self) -> i64 {
        self.reservoir.lock().charged
    }

    /// Waits for a training under way to finish.
    pub fn settle(&self) {
        let training = self.reservoir.lock().training.take();
        if let Some(t) = training {
            let _ = t.join();
        }
    }
}

/// Puts `sample` in the reservoir's `slot` (`Trainer::slot`): the bytes the reservoir
/// holds more.
fn keep(r: &mut Reservoir, slot: usize, sample: Box<[u8]>) -> i64 {
    let mut delta = alloc_size(sample.len()) as i64;
    if slot == r.samples.len() {
        r.samples.push(sample);
    } else {
        delta -= alloc_size(r.samples[slot].len()) as i64;
        r.samples[slot] = sample;
    }
    delta
}

pub(crate) fn mix(x: u64) -> u64 {
    let mut z = x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::super::Dictionary;
    use super::super::tests::document;
    use super::*;
    use crate::record::stored_len;

    #[test]
    fn trains_with_a_table_sized_to_the_samples() {
        let documents: Vec<Vec<u8>> = (0..480).map(|i| document(0, i)).collect();
        let (training, held_out) = documents.split_at(400);
        let samples: Vec<&[u8]> = training.iter().map(|d| &d[..]).collect();
        let flat: usize = samples.iter().map(|s| s.len()).sum();
        assert!(table_log(flat) < 20, "{flat} bytes of samples");
        assert!(training_bytes(&samples, 16 << 10) < 2 * flat + (2 << 20));

        let ours = train_from_samples(&samples, 16 << 10).expect("trains");
        let zstds = zstd::dict::from_samples(&samples, 16 << 10).expect("trains");
        assert!(!ours.is_empty() && ours.len() <= 16 << 10);
        let memory = Arc::new(Memory::default());
        let stored = |raw: Option<&[u8]>| -> usize {
            let dictionary = raw.map(|r| Dictionary::prepare(1, r, memory.clone()).unwrap());
            held_out
                .iter()
                .map(|d| stored_len(d, dictionary.as_deref()))
                .sum()
        };
        let (with_ours, with_zstds, with_none) =
            (stored(Some(&ours)), stored(Some(&zstds)), stored(None));
        assert!(
            with_ours * 100 <= with_zstds * 103,
            "{with_ours} vs {with_zstds}"
        );
        assert!(with_ours * 2 < with_none, "{with_ours} vs {with_none}");

        // Too few samples, or none: refused, not a panic.
        assert_eq!(train_from_samples(&samples[..2], 16 << 10), None);
        assert_eq!(train_from_samples(&[], 16 << 10), None);
    }

    fn cost(dictionaries: &Trainer<Dictionary>, schema: u8) -> usize {
        let current = dictionaries.current();
        (10_000..10_200)
            .map(|i| stored_len(&document(schema, i), current.as_deref()))
            .sum()
    }

    /// Offers documents of `schema` until a dictionary is swapped in (each window's
    /// training finishes before the next offer); how many it took.
    fn offer_until_swapped(dictionaries: &Arc<Trainer<Dictionary>>, schema: u8, from: u64) -> u64 {
        let swapped = dictionaries.counters.swapped.load(Ordering::Relaxed);
        for i in from..from + 200_000 {
            dictionaries.offer(&document(schema, i));
            dictionaries.settle();
            if dictionaries.counters.swapped.load(Ordering::Relaxed) > swapped {
                return i - from;
            }
        }
        panic!("no dictionary for schema {schema}");
    }

    /// Values written again and again (churn over the same keys) train candidates that
    /// know them by heart; judged on values they did not learn, none replaces the
    /// dictionary that fits the schema already.
    #[test]
    fn rewritten_values_do_not_swap_a_dictionary_in_every_window() {
        let settings = TrainingSettings {
            samples: 256,
            dictionary_size: 16 << 10,
        };
        let dictionaries = Arc::new(Trainer::<Dictionary>::new(settings, Arc::default()));
        offer_until_swapped(&dictionaries, 0, 0);
        let swapped = dictionaries.counters.swapped.load(Ordering::Relaxed);
        let trained = dictionaries.counters.trained.load(Ordering::Relaxed);
        // Six windows of 20 documents written over and over, each with content of its
        // own that a candidate can learn by heart.
        let rewritten = |i: u64| {
            let own: String = (0..40).map(|j| format!("{:x}", mix(i * 40 + j))).collect();
            [document(0, i), own.into_bytes()].concat()
        };
        let window = settings.samples as u64 * WINDOW_AFTER_SWAP;
        for i in 0..6 * window {
            dictionaries.offer(&rewritten(5_000 + i % 20));
            dictionaries.settle();
        }
        let trained_since = dictionaries.counters.trained.load(Ordering::Relaxed) - trained;
        let swapped_since = dictionaries.counters.swapped.load(Ordering::Relaxed) - swapped;
        assert!(
            trained_since >= 2 && swapped_since == 0,
            "{trained_since} trained, {swapped_since} swapped"
        );
    }

    /// Values of one schema, window after window: once a dictionary fits them, the
    /// windows are judged and no candidate is trained (a stationary fill used to train
    /// one a window, most of what it spent on dictionaries).
    #[test]
    fn a_stationary_schema_trains_no_more_candidates() {
        let settings = TrainingSettings {
            samples: 256,
            dictionary_size: 16 << 10,
        };
        let dictionaries = Arc::new(Trainer::<Dictionary>::new(settings, Arc::default()));
        let first = offer_until_swapped(&dictionaries, 0, 0) + 1;
        let trained = dictionaries.counters.trained.load(Ordering::Relaxed);
        let window = settings.samples as u64 * WINDOW_AFTER_SWAP;
        // Windows of 8, 16 and 32 reservoirs.
        for i in first..first + 7 * window {
            dictionaries.offer(&document(0, i));
            dictionaries.settle();
        }
        let counters = &dictionaries.counters;
        assert_eq!(
            counters.trained.load(Ordering::Relaxed),
            trained,
            "{} windows fitted",
            counters.fitted.load(Ordering::Relaxed)
        );
        assert!(counters.fitted.load(Ordering::Relaxed) >= 3);
    }

    /// The schema changes halfway: the first dictionary stops fitting, a later window
    /// trains one for the new schema, and the ratio comes back.
    #[test]
    fn the_ratio_recovers_when_the_schema_changes() {
        let memory = Arc::new(Memory::default());
        let settings = TrainingSettings {
            samples: 256,
            dictionary_size: 16 << 10,
        };
        let dictionaries = Arc::new(Trainer::<Dictionary>::new(settings, memory.clone()));
        let lz4_users = cost(&dictionaries, 0);
        offer_until_swapped(&dictionaries, 0, 0);
        let users = cost(&dictionaries, 0);
        let first = dictionaries.current().unwrap();
        assert!(
            users * 2 < lz4_users,
            "users: {users} with, {lz4_users} LZ4"
        );
        let orders_before = cost(&dictionaries, 1);
        let took = offer_until_swapped(&dictionaries, 1, 1_000_000);
        let orders_after = cost(&dictionaries, 1);
        assert!(
            orders_after * 3 < orders_before * 2,
            "orders: {orders_after} after, {orders_before} before ({took} offered)"
        );
        // Within a third of what the first schema got from its own dictionary.
        let lz4_orders = {
            let none = Trainer::<Dictionary>::new(settings, Arc::new(Memory::default()));
            cost(&none, 1)
        };
        assert!(
            (orders_after as f64 / lz4_orders as f64) < (users as f64 / lz4_users as f64) * 1.34,
            "orders {orders_after}/{lz4_orders}, users {users}/{lz4_users}"
        );
        assert!(!Arc::ptr_eq(&first, &dictionaries.current().unwrap()));
        // The old dictionary lives while someone holds it, and is uncharged after.
        let charged = memory.snapshot().dictionaries;
        drop(first);
        assert!(memory.snapshot().dictionaries < charged);
        drop(dictionaries);
        assert_eq!(memory.snapshot().dictionaries, 0, "all uncharged");
    }
}
