//! Rényi differential privacy of the sampled Gaussian mechanism, and its conversion to (ε, δ).
//!
//! Owns: the RDP of one invocation of the Poisson-subsampled Gaussian mechanism at an order α
//! (Mironov, Talwar, Zhang 2019, §3.3: the exact sum for integer α, the two-sided series for
//! fractional α), composition (RDP adds per order), and the conversion to (ε, δ) with the best
//! order (Balle et al. 2020's bound, as Opacus 1.6 and dp_accounting 0.6 convert).
//! Must not: know what is released, by whom or to whom (that is [`super::ledger`]).

/// The orders (α) at which RDP is tracked: Opacus's and dp_accounting's default list, the one
/// `dp_golden.json` was computed with (1.1 to 10.9 by 0.1, 12 to 63, 128, 256).
pub fn default_orders() -> Vec<f64> {
    let mut orders: Vec<f64> = (11..110).map(|t| f64::from(t) / 10.0).collect();
    orders.extend((12..64).map(f64::from));
    orders.extend([128.0, 256.0]);
    orders
}

/// RDP at order `alpha` of **one** invocation of the Gaussian mechanism with noise multiplier
/// `sigma` (noise standard deviation over the L2 sensitivity) on a Poisson sample of rate `q`.
///
/// `q = 0` releases nothing (0); `sigma = 0` is no privacy (∞); `q = 1` is the plain Gaussian,
/// α / (2σ²).
pub fn sampled_gaussian(q: f64, sigma: f64, alpha: f64) -> f64 {
    assert!(
        (0.0..=1.0).contains(&q),
        "sampling rate {q} is not in [0, 1]"
    );
    assert!(alpha > 1.0, "RDP order {alpha} must exceed 1");
    if q == 0.0 {
        return 0.0;
    }
    if sigma <= 0.0 || alpha.is_infinite() {
        return f64::INFINITY;
    }
    if q == 1.0 {
        return alpha / (2.0 * sigma * sigma);
    }
    let log_a = if alpha.fract() == 0.0 {
        log_a_int(q, sigma, alpha as u64)
    } else {
        log_a_frac(q, sigma, alpha)
    };
    log_a / (alpha - 1.0)
}

/// The best (ε, order) for total RDP `rdp` (one value per order in `orders`) at `delta`:
/// ε(α) = rdp(α) − (ln δ + ln α)/(α − 1) + ln((α − 1)/α), the smallest over α.
/// `(∞, NaN)` when no order gives a finite ε.
pub fn epsilon(orders: &[f64], rdp: &[f64], delta: f64) -> (f64, f64) {
    assert_eq!(orders.len(), rdp.len(), "one RDP value per order");
    assert!(
        delta > 0.0 && delta < 1.0,
        "delta {delta} must be in (0, 1)"
    );
    let mut best = (f64::INFINITY, f64::NAN);
    for (&a, &r) in orders.iter().zip(rdp) {
        let eps = r - (delta.ln() + a.ln()) / (a - 1.0) + ((a - 1.0) / a).ln();
        if eps.is_finite() && eps < best.0 {
            best = (eps.max(0.0), a);
        }
    }
    best
}

/// The smallest noise multiplier σ (to 0.1 %) under which `steps` invocations at sampling rate
/// `q` cost at most `epsilon` at `delta` over `orders`; `None` when even σ = 10⁴ does not fit.
pub fn calibrate(orders: &[f64], epsilon: f64, delta: f64, q: f64, steps: u64) -> Option<f64> {
    let spent = |sigma: f64| {
        let rdp: Vec<f64> = orders
            .iter()
            .map(|&a| steps as f64 * sampled_gaussian(q, sigma, a))
            .collect();
        epsilon_of(orders, &rdp, delta)
    };
    let (mut lo, mut hi) = (0.05_f64, 1e4_f64);
    if spent(hi) > epsilon {
        return None;
    }
    if spent(lo) <= epsilon {
        return Some(lo);
    }
    while hi / lo > 1.001 {
        let mid = (lo * hi).sqrt();
        if spent(mid) <= epsilon {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Some(hi)
}

fn epsilon_of(orders: &[f64], rdp: &[f64], delta: f64) -> f64 {
    epsilon(orders, rdp, delta).0
}

/// log(e^x + e^y), exact at −∞.
fn log_add(x: f64, y: f64) -> f64 {
    let (lo, hi) = if x < y { (x, y) } else { (y, x) };
    if lo == f64::NEG_INFINITY {
        return hi;
    }
    (lo - hi).exp().ln_1p() + hi
}

/// log(e^x − e^y) for x ≥ y; −∞ where they are equal.
fn log_sub(x: f64, y: f64) -> f64 {
    debug_assert!(x >= y, "log_sub({x}, {y}) of a negative difference");
    if y == f64::NEG_INFINITY {
        return x;
    }
    if x <= y {
        return f64::NEG_INFINITY;
    }
    let d = (x - y).exp_m1();
    if d.is_finite() { d.ln() + y } else { x }
}

/// log erfc(x), also where erfc underflows (x beyond about 26): there the asymptotic series
/// erfc(x) ≈ e^(−x²) / (x√π) · (1 − 1/(2x²) + 3/(4x⁴)).
fn log_erfc(x: f64) -> f64 {
    if x < 25.0 {
        return libm::erfc(x).ln();
    }
    let x2 = x * x;
    -x2 - (x * std::f64::consts::PI.sqrt()).ln() + (1.0 - 0.5 / x2 + 0.75 / (x2 * x2)).ln()
}

/// ln A_α for integer α: A_α = Σ_k C(α, k) (1−q)^(α−k) q^k exp((k² − k)/(2σ²)).
fn log_a_int(q: f64, sigma: f64, alpha: u64) -> f64 {
    let mut log_a = f64::NEG_INFINITY;
    let mut log_binom = 0.0; // ln C(α, 0)
    for k in 0..=alpha {
        if k > 0 {
            log_binom += ((alpha - k + 1) as f64).ln() - (k as f64).ln();
        }
        let k = k as f64;
        let term = log_binom
            + k * q.ln()
            + (alpha as f64 - k) * (1.0 - q).ln()
            + (k * k - k) / (2.0 * sigma * sigma);
        log_a = log_add(log_a, term);
    }
    log_a
}

/// ln A_α for fractional α: the two-sided series of Mironov, Talwar and Zhang (2019), §3.3,
/// summed until both sides' terms fall below e^−30.
fn log_a_frac(q: f64, sigma: f64, alpha: f64) -> f64 {
    let (mut log_a0, mut log_a1) = (f64::NEG_INFINITY, f64::NEG_INFINITY);
    let z0 = sigma * sigma * (1.0 / q - 1.0).ln() + 0.5;
    let s2 = 2.0_f64.sqrt() * sigma;
    let mut coef = 1.0_f64; // C(α, i), by the recurrence C(α, i) = C(α, i−1)(α − i + 1)/i
    for i in 0_u32.. {
        let fi = f64::from(i);
        if i > 0 {
            coef *= (alpha - fi + 1.0) / fi;
        }
        let log_coef = coef.abs().ln();
        let j = alpha - fi;
        let log_t0 = log_coef + fi * q.ln() + j * (1.0 - q).ln();
        let log_t1 = log_coef + j * q.ln() + fi * (1.0 - q).ln();
        let log_e0 = 0.5_f64.ln() + log_erfc((fi - z0) / s2);
        let log_e1 = 0.5_f64.ln() + log_erfc((z0 - j) / s2);
        let log_s0 = log_t0 + (fi * fi - fi) / (2.0 * sigma * sigma) + log_e0;
        let log_s1 = log_t1 + (j * j - j) / (2.0 * sigma * sigma) + log_e1;
        if coef > 0.0 {
            log_a0 = log_add(log_a0, log_s0);
            log_a1 = log_add(log_a1, log_s1);
        } else {
            log_a0 = log_sub(log_a0, log_s0);
            log_a1 = log_sub(log_a1, log_s1);
        }
        if log_s0.max(log_s1) < -30.0 || coef == 0.0 {
            break;
        }
    }
    log_add(log_a0, log_a1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    /// `dp_golden.json`, as `../shared/specs/` gives it (Opacus 1.6.0 and dp_accounting 0.6.0).
    #[derive(Deserialize)]
    struct Golden {
        orders: Vec<f64>,
        cases: Vec<Case>,
    }

    #[derive(Deserialize)]
    struct Case {
        sampling_rate: f64,
        noise_multiplier: f64,
        steps: u32,
        delta: f64,
        epsilon_rdp_opacus: f64,
        best_order_opacus: f64,
    }

    fn golden() -> Golden {
        serde_json::from_str(include_str!("dp_golden.json")).expect("dp_golden.json parses")
    }

    fn spent(orders: &[f64], q: f64, sigma: f64, steps: u32, delta: f64) -> (f64, f64) {
        let rdp: Vec<f64> = orders
            .iter()
            .map(|&a| f64::from(steps) * sampled_gaussian(q, sigma, a))
            .collect();
        epsilon(orders, &rdp, delta)
    }

    #[test]
    fn the_default_orders_are_the_golden_files() {
        let g = golden();
        let ours = default_orders();
        assert_eq!(ours.len(), g.orders.len());
        for (a, b) in ours.iter().zip(&g.orders) {
            assert!((a - b).abs() < 1e-9, "{a} vs {b}");
        }
    }

    #[test]
    fn every_golden_case_is_within_one_percent_of_opacus() {
        let g = golden();
        assert!(g.cases.len() >= 8, "only {} cases", g.cases.len());
        let mut worst = 0.0_f64;
        for c in &g.cases {
            let (eps, order) = spent(
                &g.orders,
                c.sampling_rate,
                c.noise_multiplier,
                c.steps,
                c.delta,
            );
            let rel = (eps - c.epsilon_rdp_opacus).abs() / c.epsilon_rdp_opacus;
            worst = worst.max(rel);
            assert!(
                rel < 0.01,
                "q={} sigma={} steps={} delta={}: epsilon {eps} (order {order}) against Opacus's {} (order {})",
                c.sampling_rate,
                c.noise_multiplier,
                c.steps,
                c.delta,
                c.epsilon_rdp_opacus,
                c.best_order_opacus
            );
        }
        eprintln!("worst relative gap to Opacus: {worst:.2e}");
    }

    #[test]
    fn calibration_finds_the_noise_that_spends_the_budget() {
        let orders = default_orders();
        for (eps, q, steps) in [(8.0, 0.33, 400_u32), (1.0, 0.01, 1000), (3.0, 1.0, 50)] {
            let sigma = calibrate(&orders, eps, 1e-5, q, u64::from(steps)).unwrap();
            let at = spent(&orders, q, sigma, steps, 1e-5).0;
            assert!(
                at <= eps && at > 0.99 * eps,
                "sigma {sigma}: {at} for {eps}"
            );
            assert!(spent(&orders, q, sigma * 0.99, steps, 1e-5).0 > eps);
        }
        // The golden case: Opacus's sigma = 1.0 for q = 0.01, 1000 steps, delta 1e-5 gives
        // epsilon 2.101; calibrating to that epsilon finds sigma 1.0 back.
        let sigma = calibrate(&orders, 2.101365, 1e-5, 0.01, 1000).unwrap();
        assert!((sigma - 1.0).abs() < 0.002, "{sigma}");
    }

    #[test]
    fn edge_cases_are_exact() {
        assert_eq!(sampled_gaussian(0.0, 1.0, 2.0), 0.0);
        assert_eq!(sampled_gaussian(0.5, 0.0, 2.0), f64::INFINITY);
        assert!((sampled_gaussian(1.0, 2.0, 3.0) - 3.0 / 8.0).abs() < 1e-15);
        // Integer and fractional paths agree where they meet.
        let (a, b) = (
            sampled_gaussian(0.01, 1.1, 3.0),
            sampled_gaussian(0.01, 1.1, 3.0 + 1e-9),
        );
        assert!((a - b).abs() / a < 1e-6, "{a} vs {b}");
        // No order gives a finite epsilon for no noise.
        assert!(
            epsilon(&[2.0, 3.0], &[f64::INFINITY; 2], 1e-5)
                .0
                .is_infinite()
        );
    }

    #[test]
    fn subsampling_and_noise_only_ever_lower_the_cost() {
        let orders = default_orders();
        let base = spent(&orders, 0.05, 1.0, 100, 1e-5).0;
        assert!(spent(&orders, 0.02, 1.0, 100, 1e-5).0 < base);
        assert!(spent(&orders, 0.05, 2.0, 100, 1e-5).0 < base);
        assert!(spent(&orders, 0.05, 1.0, 200, 1e-5).0 > base);
    }
}
