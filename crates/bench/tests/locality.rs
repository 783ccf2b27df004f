//! The key distributions match the paper's locality classes (Table 2) and Zipf.

use rand::SeedableRng;
use rand::rngs::SmallRng;
use zipcache_bench::workload::{HOT_REQUEST_SHARE, HotPlacement, KeyChooser, Locality};

const SAMPLES: u64 = 200_000;

fn hot_share(locality: &str, hot: HotPlacement) -> (f64, u64) {
    let chooser = KeyChooser::new(100_000, locality.parse().unwrap(), hot, 9).unwrap();
    let hot_ids: std::collections::HashSet<u64> = (0..chooser.hot_keys())
        .map(|r| chooser.id_of_rank(r))
        .collect();
    let mut rng = SmallRng::seed_from_u64(5);
    let in_hot = (0..SAMPLES)
        .filter(|_| hot_ids.contains(&chooser.next_id(&mut rng)))
        .count();
    (in_hot as f64 / SAMPLES as f64, chooser.hot_keys())
}

#[test]
fn each_locality_class_sends_80_percent_to_its_hot_set() {
    for (name, fraction) in [("strong", 0.08), ("moderate", 0.20), ("weak", 0.64)] {
        for hot in [HotPlacement::Random, HotPlacement::Clustered] {
            let (share, hot_keys) = hot_share(name, hot);
            assert_eq!(hot_keys, (100_000.0 * fraction) as u64, "{name}");
            assert!(
                (share - HOT_REQUEST_SHARE).abs() < 0.01,
                "{name} {hot:?}: {share:.4} of requests went to the hot set"
            );
        }
    }
}

#[test]
fn zero_locality_is_uniform() {
    let chooser = KeyChooser::new(10, Locality::Uniform, HotPlacement::Random, 1).unwrap();
    let mut counts = [0u64; 10];
    let mut rng = SmallRng::seed_from_u64(2);
    for _ in 0..SAMPLES {
        counts[chooser.next_id(&mut rng) as usize] += 1;
    }
    let expected = SAMPLES as f64 / 10.0;
    for c in counts {
        assert!((c as f64 - expected).abs() < expected * 0.05, "{counts:?}");
    }
}

#[test]
fn random_placement_spreads_hot_keys_over_the_key_space() {
    let chooser =
        KeyChooser::new(100_000, "strong".parse().unwrap(), HotPlacement::Random, 3).unwrap();
    let in_first_tenth = (0..chooser.hot_keys())
        .filter(|r| chooser.id_of_rank(*r) < 10_000)
        .count() as f64;
    let share = in_first_tenth / chooser.hot_keys() as f64;
    assert!((share - 0.1).abs() < 0.02, "{share}");
}

#[test]
fn zipf_ranks_follow_a_power_law() {
    let s = 1.0;
    let chooser = KeyChooser::new(
        1000,
        Locality::Zipf { exponent: s },
        HotPlacement::Clustered,
        1,
    )
    .unwrap();
    let mut counts = vec![0u64; 1000];
    let mut rng = SmallRng::seed_from_u64(4);
    for _ in 0..SAMPLES {
        counts[chooser.next_rank(&mut rng) as usize] += 1;
    }
    // P(rank k) ∝ 1 / (k+1)^s: rank 0 is twice rank 1 and ten times rank 9.
    let ratio1 = counts[0] as f64 / counts[1] as f64;
    let ratio9 = counts[0] as f64 / counts[9] as f64;
    assert!((ratio1 - 2.0).abs() < 0.15, "{ratio1}");
    assert!((ratio9 - 10.0).abs() < 1.2, "{ratio9}");
    // Harmonic number H(1000) ≈ 7.485: rank 0 gets ≈ 13.4% of requests.
    let top = counts[0] as f64 / SAMPLES as f64;
    assert!((top - 1.0 / 7.485).abs() < 0.01, "{top}");
}
