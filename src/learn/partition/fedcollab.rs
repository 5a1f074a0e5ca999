//! FedCollab's four-type designs (FedCollab spec §7.1): label shift with quantity skew
//! ([`cluster4`]), concept shift ([`concept4`]) and feature shift by rotation ([`rotate4`]).
//!
//! Owns: the four types' label shares, permutations and angles, image rotation, and the
//! quantity skew of the second half of the clients.
//! Must not: read files or generate data.

use super::{check_fraction, class_labels};
use crate::learn::data::{ClientData, DataError, Dataset, Federation, Labels};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

/// FedCollab's four-type label-shift design with quantity skew (FedCollab spec §7.1: the
/// official `cluster4_{odd_share}` partition followed by `clusterexp_2_{quantity_decay}`
/// subsampling). Needs 10 classes and a multiple of 4 clients.
///
/// Clients come in four consecutive blocks of `clients / 4`, one per type. Type 0 holds labels
/// {0, 1, 2, 3}, type 1 {1, 2, 3, 4}, type 2 {5, 6, 7, 8}, type 3 {6, 7, 8, 9}: a type's three
/// shared labels are split evenly with its partner type (half of each to either), its odd label
/// (0, 4, 5, 9) contributes only `odd_share` of that label's samples. With `odd_share = 0.25`
/// the odd label is 1/7 of a client's data and partner types are at total variation 1/7, while
/// types 0-1 and 2-3 share no label. Within a type, a label's samples are shuffled and cut
/// evenly between its clients (cumulative shares × count, rounded by +0.49 then truncated, as
/// the official code).
///
/// Each client then splits every one of its labels (after a shuffle) into training
/// `train_fraction · q`, discarded `train_fraction · (1 − q)` and test `1 − train_fraction`,
/// with the same rounding; `q = 1` for the first half of the clients ("large") and
/// `exp(−quantity_decay)` for the second half ("small"), so test sets follow each client's
/// distribution and have the same size for large and small clients. Every client's
/// [`ClientData::group`] is its type; [`Federation::group_labels`] holds the four label sets.
///
/// Errors ([`DataError::Invalid`]): not 10 classes, `clients` not a positive multiple of 4,
/// `odd_share` outside [0, 1], `train_fraction` outside (0, 1), `quantity_decay` negative or
/// not finite, or a client left with no training or no test sample.
pub fn cluster4(
    pool: &Dataset,
    clients: usize,
    odd_share: f64,
    train_fraction: f64,
    quantity_decay: f64,
    rng: &mut StdRng,
) -> Result<Federation, DataError> {
    let (ids, num_classes) = class_labels(pool, "cluster4")?;
    if num_classes != 10 {
        return Err(DataError::Invalid(format!(
            "cluster4: the design needs exactly 10 classes, the data set has {num_classes}"
        )));
    }
    if clients == 0 || clients % 4 != 0 {
        return Err(DataError::Invalid(format!(
            "cluster4: clients = {clients} must be a positive multiple of 4 (four types)"
        )));
    }
    if !(0.0..=1.0).contains(&odd_share) {
        return Err(DataError::Invalid(format!(
            "cluster4: odd_share = {odd_share} is outside the allowed range [0, 1]"
        )));
    }
    check_fraction(train_fraction)?;
    if !(quantity_decay.is_finite() && quantity_decay >= 0.0) {
        return Err(DataError::Invalid(format!(
            "cluster4: quantity_decay = {quantity_decay} must be a finite number >= 0"
        )));
    }
    let k = odd_share;
    let shares: [[f64; 10]; 4] = [
        [k, 0.5, 0.5, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        [0.0, 0.5, 0.5, 0.5, k, 0.0, 0.0, 0.0, 0.0, 0.0],
        [0.0, 0.0, 0.0, 0.0, 0.0, k, 0.5, 0.5, 0.5, 0.0],
        [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.5, k],
    ];
    let per_type = clients / 4;
    let cut = |x: f64| (x + 0.49) as usize;
    let mut client_rows: Vec<Vec<usize>> = vec![Vec::new(); clients];
    for (label, _) in shares[0].iter().enumerate() {
        let mut rows: Vec<usize> = (0..ids.len())
            .filter(|&i| ids[i] as usize == label)
            .collect();
        rows.shuffle(rng);
        let n = rows.len() as f64;
        let mut cum = 0.0;
        let mut start = 0;
        for (c, owned) in client_rows.iter_mut().enumerate() {
            cum += shares[c / per_type][label] / per_type as f64;
            let end = cut(cum * n).min(rows.len());
            owned.extend_from_slice(&rows[start..end.max(start)]);
            start = end.max(start);
        }
    }
    let small_q = (-quantity_decay).exp();
    let mut out = Vec::with_capacity(clients);
    for (c, owned) in client_rows.into_iter().enumerate() {
        let q = if c < clients / 2 { 1.0 } else { small_q };
        let (mut train, mut test) = (Vec::new(), Vec::new());
        for label in 0..num_classes as u32 {
            let mut rows: Vec<usize> = owned.iter().copied().filter(|&i| ids[i] == label).collect();
            rows.shuffle(rng);
            let n = rows.len() as f64;
            let t = cut(train_fraction * q * n).min(rows.len());
            let kept = cut(train_fraction * n).clamp(t, rows.len());
            train.extend_from_slice(&rows[..t]);
            test.extend_from_slice(&rows[kept..]);
        }
        if train.is_empty() || test.is_empty() {
            return Err(DataError::Invalid(format!(
                "cluster4: client {c} gets {} training and {} test samples; each client needs at \
                 least 1 of each (use more data, a smaller quantity_decay or another \
                 train_fraction)",
                train.len(),
                test.len()
            )));
        }
        out.push(ClientData {
            train: pool.subset(&train),
            test: pool.subset(&test),
            group: Some(c / per_type),
        });
    }
    let group_labels = shares
        .iter()
        .map(|row| (0..10u32).filter(|&l| row[l as usize] > 0.0).collect())
        .collect();
    Ok(Federation {
        clients: out,
        group_labels: Some(group_labels),
    })
}

/// The label permutations of [`concept4`]'s four types (10 classes): 0 the identity, 1 reverses
/// labels 0–2, 2 reverses all ten, 3 maps i < 3 to 7 + i and i ≥ 3 to 9 − i. Types 0 and 1 agree
/// on 8 labels and types 2 and 3 on 8; across the two pairs they agree on none (the FedCollab
/// spec §7.1 design for coarse CIFAR-100, scaled from 20 classes to 10).
pub const CONCEPT4_PERMUTATIONS: [[u32; 10]; 4] = [
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9],
    [2, 1, 0, 3, 4, 5, 6, 7, 8, 9],
    [9, 8, 7, 6, 5, 4, 3, 2, 1, 0],
    [7, 8, 9, 6, 5, 4, 3, 2, 1, 0],
];

/// FedCollab's concept shift (FedCollab spec §7.1, on 10 classes): the pool is split IID into
/// `clients` equal parts (balanced labels), client `c` is of type `c / (clients / 4)` and sees
/// every label through its type's permutation ([`CONCEPT4_PERMUTATIONS`]): the same images,
/// different P(y|x). As in [`cluster4`], the second half of the clients keep
/// `exp(−quantity_decay)` of their training share; test sets are not shrunk.
///
/// Errors ([`DataError::Invalid`]): regression labels, a class count other than 10, `clients`
/// not a positive multiple of 4, `train_fraction` outside (0, 1), a negative or non-finite
/// `quantity_decay`, or a client left without training or test samples.
pub fn concept4(
    pool: &Dataset,
    clients: usize,
    train_fraction: f64,
    quantity_decay: f64,
    rng: &mut StdRng,
) -> Result<Federation, DataError> {
    let (_, num_classes) = class_labels(pool, "concept4")?;
    if num_classes != 10 {
        return Err(DataError::Invalid(format!(
            "concept4: the design needs exactly 10 classes, the data set has {num_classes}"
        )));
    }
    four_types(
        pool,
        clients,
        train_fraction,
        quantity_decay,
        rng,
        "concept4",
        |kind, d| {
            let perm = &CONCEPT4_PERMUTATIONS[kind];
            let mapped: Vec<u32> = match &d.labels {
                Labels::Class { ids, .. } => ids.iter().map(|&y| perm[y as usize]).collect(),
                Labels::Real(_) => unreachable!("class labels checked above"),
            };
            Dataset::new(
                d.features,
                d.sample_shape,
                Labels::Class {
                    ids: mapped,
                    num_classes,
                },
            )
        },
    )
}

/// The rotations of [`rotate4`]'s four types, in degrees counter-clockwise: the official
/// code's −25, +25, 155 and 205 (FedCollab spec §7.1; type 0 is 180° from type 2 and 130°
/// from type 3).
pub const ROTATE4_DEGREES: [f64; 4] = [-25.0, 25.0, 155.0, 205.0];

/// FedCollab's feature shift (FedCollab spec §7.1): an IID split as in [`concept4`], client `c`
/// of type `c / (clients / 4)` sees every image (train and test) rotated by its type's angle
/// ([`ROTATE4_DEGREES`]): the same labels, different P(x). Images are rotated about their
/// centre with bilinear interpolation and symmetric padding, then cropped back to their size
/// (the official code's pad, rotate, centre-crop), channel by channel. The second half of the
/// clients keep `exp(−quantity_decay)` of their training share.
///
/// Errors ([`DataError::Invalid`]): regression labels, samples that are not images
/// (`[channels, height, width]`), `clients` not a positive multiple of 4, `train_fraction`
/// outside (0, 1), a negative or non-finite `quantity_decay`, or a client left without
/// training or test samples.
pub fn rotate4(
    pool: &Dataset,
    clients: usize,
    train_fraction: f64,
    quantity_decay: f64,
    rng: &mut StdRng,
) -> Result<Federation, DataError> {
    class_labels(pool, "rotate4")?;
    let &[channels, h, w] = pool.sample_shape.as_slice() else {
        return Err(DataError::Invalid(format!(
            "rotate4: samples of shape {:?} are not images [channels, height, width]",
            pool.sample_shape
        )));
    };
    four_types(
        pool,
        clients,
        train_fraction,
        quantity_decay,
        rng,
        "rotate4",
        |kind, mut d| {
            let plane = h * w;
            let mut out = vec![0f32; plane];
            for img in d.features.chunks_mut(plane) {
                rotate_image(img, h, w, ROTATE4_DEGREES[kind], &mut out);
                img.copy_from_slice(&out);
            }
            debug_assert_eq!(d.features.len() % (channels * plane), 0);
            Ok(d)
        },
    )
}

/// `img` (`h × w`, row-major) rotated counter-clockwise by `degrees` about its centre into
/// `out`: each output pixel samples the input at the inversely rotated position, bilinearly,
/// with positions outside the image reflected symmetrically (`… c b a | a b c | c b a …`).
pub fn rotate_image(img: &[f32], h: usize, w: usize, degrees: f64, out: &mut [f32]) {
    let (sin, cos) = degrees.to_radians().sin_cos();
    let (cy, cx) = ((h as f64 - 1.0) / 2.0, (w as f64 - 1.0) / 2.0);
    // Symmetric reflection of an integer index into 0..n.
    let reflect = |k: i64, n: usize| -> usize {
        let n = n as i64;
        let m = k.rem_euclid(2 * n);
        (if m < n { m } else { 2 * n - 1 - m }) as usize
    };
    for y in 0..h {
        for x in 0..w {
            // Image rows grow downwards: rotate (x, −y) counter-clockwise, i.e. sample the
            // source at the clockwise-rotated position.
            let (dx, dy) = (x as f64 - cx, cy - y as f64);
            let sx = cos * dx + sin * dy + cx;
            let sy = cy - (-sin * dx + cos * dy);
            let (x0, y0) = (sx.floor(), sy.floor());
            let (fx, fy) = ((sx - x0) as f32, (sy - y0) as f32);
            let (x0, y0) = (x0 as i64, y0 as i64);
            let at = |yy: i64, xx: i64| img[reflect(yy, h) * w + reflect(xx, w)];
            let top = at(y0, x0) * (1.0 - fx) + at(y0, x0 + 1) * fx;
            let bottom = at(y0 + 1, x0) * (1.0 - fx) + at(y0 + 1, x0 + 1) * fx;
            out[y * w + x] = top * (1.0 - fy) + bottom * fy;
        }
    }
}

/// The four-type IID design shared by [`concept4`] and [`rotate4`]: an IID split into
/// `clients` equal parts, client `c` of type `c / (clients / 4)`, the second half keeping
/// `exp(−quantity_decay)` of their training share, and `transform(type, data)` applied to each
/// client's training and test sets.
fn four_types(
    pool: &Dataset,
    clients: usize,
    train_fraction: f64,
    quantity_decay: f64,
    rng: &mut StdRng,
    name: &str,
    transform: impl Fn(usize, Dataset) -> Result<Dataset, DataError>,
) -> Result<Federation, DataError> {
    if clients == 0 || clients % 4 != 0 {
        return Err(DataError::Invalid(format!(
            "{name}: clients = {clients} must be a positive multiple of 4 (four types)"
        )));
    }
    check_fraction(train_fraction)?;
    if !(quantity_decay.is_finite() && quantity_decay >= 0.0) {
        return Err(DataError::Invalid(format!(
            "{name}: quantity_decay = {quantity_decay} must be a finite number >= 0"
        )));
    }
    let per_type = clients / 4;
    let mut order: Vec<usize> = (0..pool.len()).collect();
    order.shuffle(rng);
    let size = order.len() / clients;
    let small_q = (-quantity_decay).exp();
    let cut = |x: f64| (x + 0.49) as usize;
    let mut out = Vec::with_capacity(clients);
    for c in 0..clients {
        let mut rows = order[c * size..(c + 1) * size].to_vec();
        rows.shuffle(rng);
        let q = if c < clients / 2 { 1.0 } else { small_q };
        let n = rows.len() as f64;
        let t = cut(train_fraction * q * n).min(rows.len());
        let kept = cut(train_fraction * n).clamp(t, rows.len());
        if t == 0 || kept == rows.len() {
            return Err(DataError::Invalid(format!(
                "{name}: client {c} gets {t} training and {} test samples; each client needs at \
                 least 1 of each (use more data, a smaller quantity_decay or another \
                 train_fraction)",
                rows.len() - kept
            )));
        }
        let kind = c / per_type;
        out.push(ClientData {
            train: transform(kind, pool.subset(&rows[..t]))?,
            test: transform(kind, pool.subset(&rows[kept..]))?,
            group: Some(kind),
        });
    }
    Ok(Federation {
        clients: out,
        group_labels: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::learn::partition::tests::{assert_disjoint, assert_invalid, pool, rng, same};

    #[test]
    fn rotate_image_turns_pixels_about_the_centre() {
        // A 3×3 image 0..9, row-major.
        let img: Vec<f32> = (0..9).map(|v| v as f32).collect();
        let mut out = vec![0.0; 9];
        rotate_image(&img, 3, 3, 0.0, &mut out);
        assert_eq!(out, img);
        // 90° counter-clockwise: the top row becomes the left column, read bottom-up.
        rotate_image(&img, 3, 3, 90.0, &mut out);
        let want = [2.0, 5.0, 8.0, 1.0, 4.0, 7.0, 0.0, 3.0, 6.0];
        for (a, b) in out.iter().zip(want) {
            assert!((a - b).abs() < 1e-5, "{out:?}");
        }
        // 180°: reversed; and 155° then 205° is a full turn (up to interpolation, exactly at
        // the centre pixel, which never moves).
        rotate_image(&img, 3, 3, 180.0, &mut out);
        for (a, b) in out.iter().zip(img.iter().rev()) {
            assert!((a - b).abs() < 1e-5, "{out:?}");
        }
        rotate_image(&img, 3, 3, 25.0, &mut out);
        assert!((out[4] - 4.0).abs() < 1e-6);
        // A constant image stays constant at any angle (symmetric padding brings nothing new).
        let flat = vec![0.5f32; 16];
        let mut o = vec![0.0; 16];
        for deg in ROTATE4_DEGREES {
            rotate_image(&flat, 4, 4, deg, &mut o);
            assert!(o.iter().all(|&v| (v - 0.5).abs() < 1e-6), "{deg}: {o:?}");
        }
    }

    #[test]
    fn rotate4_rotates_each_type_and_keeps_labels() {
        // 400 images 1×4×4 whose pixels encode their row, labels 0..9.
        let n = 400;
        let feats: Vec<f32> = (0..n)
            .flat_map(|i| (0..16).map(move |k| (i * 16 + k) as f32))
            .collect();
        let ids: Vec<u32> = (0..n).map(|i| (i % 10) as u32).collect();
        let p = Dataset::new(
            feats,
            vec![1, 4, 4],
            Labels::Class {
                ids,
                num_classes: 10,
            },
        )
        .unwrap();
        let f = rotate4(&p, 8, 0.5, 1.0, &mut rng(4)).unwrap();
        let g = concept4(&p, 8, 0.5, 1.0, &mut rng(4)).unwrap();
        let mut out = vec![0.0; 16];
        for (c, (rot, same)) in f.clients.iter().zip(&g.clients).enumerate() {
            assert_eq!(rot.group, Some(c / 2));
            assert_eq!(
                rot.train.len(),
                same.train.len(),
                "the same rows as concept4"
            );
            // Labels untouched; each image is its source rotated by the type's angle.
            for (d, src) in [(&rot.train, &same.train), (&rot.test, &same.test)] {
                let Labels::Class { ids, .. } = &d.labels else {
                    unreachable!()
                };
                let first = src.features[0] as usize / 16;
                assert_eq!(ids[0], (first % 10) as u32);
                rotate_image(&src.features[..16], 4, 4, ROTATE4_DEGREES[c / 2], &mut out);
                assert_eq!(&d.features[..16], &out[..], "client {c}");
            }
        }
        let vectors = pool(400, 10);
        let e = rotate4(&vectors, 8, 0.5, 1.0, &mut rng(4)).unwrap_err();
        assert!(e.to_string().contains("not images"), "{e}");
        assert!(rotate4(&p, 6, 0.5, 1.0, &mut rng(4)).is_err());
    }

    #[test]
    fn concept4_permutes_labels_by_type_and_shrinks_the_second_half() {
        let p = pool(4000, 10);
        let f = concept4(&p, 8, 0.5, 3.0, &mut rng(2)).unwrap();
        assert_eq!(f.clients.len(), 8);
        // Each permutation is a bijection; pairs (0, 1) and (2, 3) agree on 8 labels, across
        // pairs on none.
        for perm in &CONCEPT4_PERMUTATIONS {
            let mut sorted = perm.to_vec();
            sorted.sort();
            assert_eq!(sorted, (0..10).collect::<Vec<u32>>());
        }
        let agree = |a: usize, b: usize| {
            (0..10)
                .filter(|&l| CONCEPT4_PERMUTATIONS[a][l] == CONCEPT4_PERMUTATIONS[b][l])
                .count()
        };
        assert_eq!((agree(0, 1), agree(2, 3)), (8, 8));
        assert_eq!(
            (agree(0, 2), agree(0, 3), agree(1, 2), agree(1, 3)),
            (0, 0, 0, 0)
        );
        for (c, client) in f.clients.iter().enumerate() {
            assert_eq!(client.group, Some(c / 2));
            // 500 rows each: 250 for training (or exp(-3) of it), 250 for test.
            assert_eq!(client.test.len(), 250);
            let want = if c < 4 {
                250
            } else {
                (250.0 * (-3f64).exp() + 0.49) as usize
            };
            assert_eq!(client.train.len(), want, "client {c}");
        }
        // Same seed, same split; a client's labels are its type's permutation of the pool's.
        let g = concept4(&p, 8, 0.5, 3.0, &mut rng(2)).unwrap();
        assert_eq!(f.clients[5].train.features, g.clients[5].train.features);
        let Labels::Class { ids: pool_ids, .. } = &p.labels else {
            unreachable!()
        };
        let Labels::Class { ids: got, .. } = &f.clients[5].test.labels else {
            unreachable!()
        };
        let d = p.feature_len();
        for (row, &y) in got.iter().enumerate() {
            let x = &f.clients[5].test.features[row * d..(row + 1) * d];
            let src = (0..p.len())
                .find(|&i| &p.features[i * d..(i + 1) * d] == x)
                .unwrap();
            assert_eq!(y, CONCEPT4_PERMUTATIONS[2][pool_ids[src] as usize]);
        }
        assert!(concept4(&p, 6, 0.5, 3.0, &mut rng(2)).is_err());
    }

    #[test]
    fn cluster4_types_shares_and_quantity_skew() {
        // 700 samples per label; 8 clients, 2 per type: a shared label gives each of its 4
        // clients 700 · 0.5 / 2 = 175, an odd label each of its 2 clients 700 · 0.25 / 2 = 87.5.
        let p = pool(7000, 10);
        let decay = 10f64.ln();
        let f = cluster4(&p, 8, 0.25, 0.6, decay, &mut rng(1)).unwrap();
        assert_disjoint(&f);
        let gl = f.group_labels.clone().unwrap();
        assert_eq!(
            gl,
            vec![
                vec![0, 1, 2, 3],
                vec![1, 2, 3, 4],
                vec![5, 6, 7, 8],
                vec![6, 7, 8, 9]
            ]
        );
        for (c, client) in f.clients.iter().enumerate() {
            let t = c / 2;
            assert_eq!(client.group, Some(t));
            let counts = client.test.class_counts();
            for l in 0..10u32 {
                let have = counts[l as usize] > 0 || client.train.class_counts()[l as usize] > 0;
                assert_eq!(have, gl[t].contains(&l), "client {c} label {l}");
            }
            // Test: 40 % of 175 = 70 per shared label, ~35 of the odd one.
            assert!(
                (3 * 70 + 34..=3 * 70 + 36).contains(&client.test.len()),
                "{}",
                client.test.len()
            );
            let train = client.train.len() as f64;
            let want = if c < 4 { 0.6 * 612.5 } else { 0.06 * 612.5 };
            assert!((train - want).abs() <= 3.0, "client {c}: {train} vs {want}");
        }
        // Partner types share three labels; the odd label is half a shared label's count.
        let c0 = f.clients[0].train.class_counts();
        assert!((c0[0] as f64 - c0[1] as f64 / 2.0).abs() <= 1.0, "{c0:?}");
        let again = cluster4(&p, 8, 0.25, 0.6, decay, &mut rng(1)).unwrap();
        assert!(same(&f, &again));
        assert_invalid(
            cluster4(&p, 6, 0.25, 0.6, 0.0, &mut rng(1)),
            &["clients = 6", "multiple of 4"],
        );
        assert_invalid(
            cluster4(&pool(700, 7), 8, 0.25, 0.6, 0.0, &mut rng(1)),
            &["10 classes", "7"],
        );
        assert_invalid(
            cluster4(&p, 8, 0.25, 0.6, -1.0, &mut rng(1)),
            &["quantity_decay = -1"],
        );
        assert_invalid(
            cluster4(&pool(80, 10), 8, 0.25, 0.6, 5.0, &mut rng(1)),
            &["client 4", "training"],
        );
    }
}
