//! Keys, locality and the op mix: which key and which operation comes next.

use std::str::FromStr;

use rand::Rng;
use rand_distr::{Distribution, Zipf};
use serde::Serialize;

/// Share of requests that go to the hot set of a `strong|moderate|weak` workload (paper §4).
pub const HOT_REQUEST_SHARE: f64 = 0.8;

/// How requests are spread over the key space (paper Table 2).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Locality {
    /// `HOT_REQUEST_SHARE` of the requests go to this fraction of the keys.
    HotSet {
        hot_fraction: f64,
    },
    Uniform,
    Zipf {
        exponent: f64,
    },
}

impl FromStr for Locality {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        Ok(match text {
            "strong" => Locality::HotSet { hot_fraction: 0.08 },
            "moderate" => Locality::HotSet { hot_fraction: 0.20 },
            "weak" => Locality::HotSet { hot_fraction: 0.64 },
            "zero" | "uniform" => Locality::Uniform,
            _ => match text.strip_prefix("zipf:").map(str::parse::<f64>) {
                Some(Ok(exponent)) if exponent > 0.0 => Locality::Zipf { exponent },
                _ => {
                    return Err(format!(
                        "locality must be strong, moderate, weak, zero or zipf:S (S > 0), not {text:?}"
                    ));
                }
            },
        })
    }
}

/// Where the hot keys sit in the key space.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum HotPlacement {
    /// Spread over the whole key space, so hot keys share leaves with cold ones.
    Random,
    /// The lowest key ids, so hot keys are neighbours.
    Clustered,
}

/// The key of id `id`: its zero-padded decimal form, `size` bytes long, so neighbouring ids
/// share prefixes the way real ids do.
pub fn key_bytes(id: u64, size: usize) -> Vec<u8> {
    format!("{id:0size$}").into_bytes()
}

/// Decimal digits needed to write `id`.
pub fn digits(id: u64) -> usize {
    id.checked_ilog10().map_or(1, |d| d as usize + 1)
}

/// A bijection of `0..n` (`rank * a + b mod n`, `a` coprime to `n`) that scatters ranks over
/// the key space; cheap enough to apply per request and needs no table.
#[derive(Clone, Debug)]
struct Scatter {
    n: u64,
    a: u64,
    b: u64,
}

fn gcd(mut x: u64, mut y: u64) -> u64 {
    while y != 0 {
        (x, y) = (y, x % y);
    }
    x
}

impl Scatter {
    fn new(n: u64, seed: u64) -> Scatter {
        let n = n.max(1);
        // Start near n·φ so consecutive ranks land far apart, then walk to a coprime.
        let mut a = ((n as f64 * 0.618_033_988_75) as u64 ^ (seed & 0xff)) % n;
        a = a.max(1);
        while gcd(a, n) != 1 {
            a = a % n + 1;
        }
        Scatter {
            n,
            a,
            b: crate::values::mix64(seed) % n,
        }
    }

    fn apply(&self, rank: u64) -> u64 {
        ((rank as u128 * self.a as u128 + self.b as u128) % self.n as u128) as u64
    }
}

/// Draws key ids with the requested locality.
#[derive(Clone, Debug)]
pub struct KeyChooser {
    keys: u64,
    locality: Locality,
    hot_keys: u64,
    zipf: Option<Zipf<f64>>,
    scatter: Option<Scatter>,
}

impl KeyChooser {
    pub fn new(
        keys: u64,
        locality: Locality,
        hot: HotPlacement,
        seed: u64,
    ) -> Result<KeyChooser, String> {
        if keys == 0 {
            return Err("--keys must be at least 1".into());
        }
        let hot_keys = match locality {
            Locality::HotSet { hot_fraction } => {
                ((keys as f64 * hot_fraction) as u64).clamp(1, keys)
            }
            _ => keys,
        };
        let zipf = match locality {
            Locality::Zipf { exponent } => {
                Some(Zipf::new(keys as f64, exponent).map_err(|e| format!("zipf: {e}"))?)
            }
            _ => None,
        };
        let scatter = (hot == HotPlacement::Random).then(|| Scatter::new(keys, seed));
        Ok(KeyChooser {
            keys,
            locality,
            hot_keys,
            zipf,
            scatter,
        })
    }

    /// Popularity rank of the next request: rank 0 is the hottest key.
    pub fn next_rank(&self, rng: &mut impl Rng) -> u64 {
        match (self.locality, &self.zipf) {
            (_, Some(zipf)) => (zipf.sample(rng) as u64).clamp(1, self.keys) - 1,
            (Locality::HotSet { .. }, _) if self.hot_keys < self.keys => {
                if rng.random_bool(HOT_REQUEST_SHARE) {
                    rng.random_range(0..self.hot_keys)
                } else {
                    rng.random_range(self.hot_keys..self.keys)
                }
            }
            _ => rng.random_range(0..self.keys),
        }
    }

    /// The key id of popularity rank `rank`.
    pub fn id_of_rank(&self, rank: u64) -> u64 {
        self.scatter.as_ref().map_or(rank, |s| s.apply(rank))
    }

    pub fn next_id(&self, rng: &mut impl Rng) -> u64 {
        self.id_of_rank(self.next_rank(rng))
    }

    /// Number of keys in the hot set (all keys when there is none).
    pub fn hot_keys(&self) -> u64 {
        self.hot_keys
    }
}

/// One operation of the mix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    Get,
    Put,
    Delete,
    Scan,
}

/// GET:PUT:DELETE:SCAN shares, normalised to sum to 1.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct OpMix {
    pub get: f64,
    pub put: f64,
    pub delete: f64,
    pub scan: f64,
}

impl OpMix {
    pub fn new(get: f64, put: f64, delete: f64, scan: f64) -> Result<OpMix, String> {
        let parts = [get, put, delete, scan];
        let sum: f64 = parts.iter().sum();
        if parts.iter().any(|p| !p.is_finite() || *p < 0.0) || sum <= 0.0 {
            return Err("op ratios must be non-negative and not all zero".into());
        }
        Ok(OpMix {
            get: get / sum,
            put: put / sum,
            delete: delete / sum,
            scan: scan / sum,
        })
    }

    pub fn next(&self, rng: &mut impl Rng) -> OpKind {
        let x: f64 = rng.random();
        if x < self.get {
            OpKind::Get
        } else if x < self.get + self.put {
            OpKind::Put
        } else if x < self.get + self.put + self.delete {
            OpKind::Delete
        } else {
            OpKind::Scan
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    #[test]
    fn keys_are_zero_padded_decimal_ids() {
        assert_eq!(key_bytes(42, 16), b"0000000000000042");
        assert_eq!(key_bytes(0, 4), b"0000");
        assert_eq!(digits(0), 1);
        assert_eq!(digits(9), 1);
        assert_eq!(digits(10), 2);
        assert_eq!(digits(2_999_999), 7);
    }

    #[test]
    fn scatter_is_a_bijection() {
        for n in [1u64, 2, 10, 97, 1000, 1024] {
            let s = Scatter::new(n, 7);
            let mut seen: Vec<u64> = (0..n).map(|r| s.apply(r)).collect();
            seen.sort_unstable();
            assert_eq!(seen, (0..n).collect::<Vec<_>>(), "n = {n}");
        }
    }

    #[test]
    fn clustered_hot_keys_are_the_lowest_ids() {
        let c =
            KeyChooser::new(1000, "strong".parse().unwrap(), HotPlacement::Clustered, 1).unwrap();
        assert_eq!(c.hot_keys(), 80);
        assert_eq!(c.id_of_rank(5), 5);
    }

    #[test]
    fn locality_names_parse() {
        assert_eq!("zero".parse::<Locality>().unwrap(), Locality::Uniform);
        assert_eq!(
            "zipf:0.9".parse::<Locality>().unwrap(),
            Locality::Zipf { exponent: 0.9 }
        );
        assert!("zipf:x".parse::<Locality>().is_err());
        assert!("hot".parse::<Locality>().is_err());
    }

    #[test]
    fn op_mix_is_normalised_and_honoured() {
        let mix = OpMix::new(9.0, 1.0, 0.0, 0.0).unwrap();
        assert!((mix.get - 0.9).abs() < 1e-12);
        let mut rng = SmallRng::seed_from_u64(3);
        let puts = (0..100_000)
            .filter(|_| mix.next(&mut rng) == OpKind::Put)
            .count();
        assert!((9_000..11_000).contains(&puts), "{puts}");
        assert!(OpMix::new(0.0, 0.0, 0.0, 0.0).is_err());
    }
}
