//! Partitioners: who gets which sample. All are seeded and deterministic for a given RNG.
//! Owns: label-group (FedeRiCo spec §7.1), Dirichlet over label clusters (Table 4), pathological
//! shards, IID, FedCollab's four-type label shift with quantity skew, FedDisco's NIID-2 (biased
//! clients plus uniform ones); the per-client train/test split; subsampling a pool.
//! Must not: read files or generate data.

use super::data::{ClientData, DataError, Dataset, Federation, Labels};
use rand::RngExt;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand_distr::{Binomial, Distribution, Gamma};

/// Tries at drawing a group assignment with every group non-empty before falling back to a
/// balanced random assignment (only reached when `groups` is close to `clients` and large).
const MAX_GROUP_DRAWS: usize = 100_000;

/// Tries at drawing Dirichlet counts that leave every client at least one train and one test
/// sample before giving up with [`DataError::Invalid`].
const MAX_DIRICHLET_DRAWS: usize = 1_000;

/// A random `fraction` of `pool` (e.g. the paper's 10% of CIFAR-10's training set).
///
/// Keeps `round(fraction · len)` samples drawn without replacement, in their original order.
/// `fraction` must be in (0, 1] (1 keeps the whole pool) and keep at least one sample.
pub fn subsample(pool: &Dataset, fraction: f64, rng: &mut StdRng) -> Result<Dataset, DataError> {
    if !(fraction > 0.0 && fraction <= 1.0) {
        return Err(DataError::Invalid(format!(
            "subsample fraction = {fraction} is outside the allowed range (0, 1]"
        )));
    }
    let n = pool.len();
    let keep = (fraction * n as f64).round() as usize;
    if keep == 0 {
        return Err(DataError::Invalid(format!(
            "subsample fraction = {fraction} of {n} samples keeps none; it must keep at least 1"
        )));
    }
    let mut idx: Vec<usize> = (0..n).collect();
    idx.shuffle(rng);
    idx.truncate(keep);
    idx.sort_unstable();
    Ok(pool.subset(&idx))
}

/// Label groups (spec §7.1): shuffle the labels into `groups` near-equal disjoint sets, assign
/// each client a group uniformly at random (re-drawn until every group has a client), split each
/// group's samples into equal disjoint shards for its clients, then `train_fraction` of each
/// client's samples for training and the rest for test.
///
/// Details: the labels are all of `0..num_classes` (not only those present), shuffled and cut
/// into contiguous chunks whose sizes differ by at most one (the first `num_classes % groups`
/// groups get the extra label); each group's label set is reported sorted in
/// [`Federation::group_labels`], and every client's [`ClientData::group`] is set. A group's
/// samples are shuffled and cut into `floor(n_g / c_g)`-sample shards (the remainder, fewer than
/// `c_g` samples, is left out), given to the group's clients in increasing client id. Each client
/// then shuffles its shard and keeps `round(train_fraction · n)` samples for training.
/// If `MAX_GROUP_DRAWS` (100 000) draws all leave a group empty (only plausible when `groups`
/// is close to a large `clients`), the assignment falls back to a random balanced one.
///
/// Errors ([`DataError::Invalid`]): regression labels, `clients == 0`, `groups` outside
/// `1..=min(clients, num_classes)`, `train_fraction` outside (0, 1), or a client left with no
/// training or no test sample.
pub fn label_groups(
    pool: &Dataset,
    clients: usize,
    groups: usize,
    train_fraction: f64,
    rng: &mut StdRng,
) -> Result<Federation, DataError> {
    let (ids, num_classes) = class_labels(pool, "label_groups")?;
    check_clients(clients)?;
    check_fraction(train_fraction)?;
    if groups == 0 || groups > clients || groups > num_classes {
        return Err(DataError::Invalid(format!(
            "label_groups: groups = {groups} is outside the allowed range 1..={} (at most the \
             {clients} clients and the {num_classes} classes)",
            clients.min(num_classes)
        )));
    }
    let group_labels = shuffled_label_sets(num_classes, groups, rng);
    let group_of_label = label_to_set(&group_labels, num_classes);
    let assignment = assign_groups(clients, groups, rng);

    let mut members: Vec<Vec<usize>> = vec![Vec::new(); groups];
    for (i, &y) in ids.iter().enumerate() {
        members[group_of_label[y as usize]].push(i);
    }
    let mut client_rows: Vec<Vec<usize>> = vec![Vec::new(); clients];
    for (g, rows) in members.iter_mut().enumerate() {
        rows.shuffle(rng);
        let owners: Vec<usize> = (0..clients).filter(|&c| assignment[c] == g).collect();
        let shard = rows.len() / owners.len();
        for (k, &c) in owners.iter().enumerate() {
            client_rows[c] = rows[k * shard..(k + 1) * shard].to_vec();
        }
    }
    let groups_of: Vec<Option<usize>> = assignment.into_iter().map(Some).collect();
    build(
        pool,
        client_rows,
        &groups_of,
        train_fraction,
        Some(group_labels),
        "label_groups",
        rng,
    )
}

/// Dirichlet over label clusters (spec §7.1, Table 4; FedEM's `split_dataset_by_labels`).
///
/// The labels `0..num_classes` are shuffled into `clusters` near-equal disjoint clusters (as in
/// [`label_groups`]); each cluster's samples are shuffled; for each cluster the client proportions
/// are drawn from Dirichlet(`alpha` · 1_K) and the cluster's samples are cut into contiguous
/// slices of multinomial(n_cluster, proportions) sizes, client 0 first. Each client then shuffles
/// its samples and keeps `round(train_fraction · n)` for training. Small `alpha` gives very
/// unequal mixtures (and sizes), large `alpha` near-IID clients.
///
/// [`ClientData::group`] is `None` (clients are mixtures); [`Federation::group_labels`] holds the
/// clusters' label sets, sorted. When a draw leaves a client with no training or no test sample
/// the whole draw is repeated (up to `MAX_DIRICHLET_DRAWS` = 1 000 times, so the split is
/// conditioned on every client being usable), then [`DataError::Invalid`] is returned.
///
/// Errors ([`DataError::Invalid`]): regression labels, `clients == 0`, `clusters` outside
/// `1..=num_classes`, `alpha` not a finite value > 0, `train_fraction` outside (0, 1), or no
/// usable draw.
pub fn dirichlet(
    pool: &Dataset,
    clients: usize,
    clusters: usize,
    alpha: f64,
    train_fraction: f64,
    rng: &mut StdRng,
) -> Result<Federation, DataError> {
    let (ids, num_classes) = class_labels(pool, "dirichlet")?;
    check_clients(clients)?;
    check_fraction(train_fraction)?;
    if clusters == 0 || clusters > num_classes {
        return Err(DataError::Invalid(format!(
            "dirichlet: clusters = {clusters} is outside the allowed range 1..={num_classes} (the number of classes)"
        )));
    }
    if !(alpha > 0.0 && alpha.is_finite()) {
        return Err(DataError::Invalid(format!(
            "dirichlet: alpha = {alpha} is outside the allowed range (0, ∞)"
        )));
    }
    let cluster_labels = shuffled_label_sets(num_classes, clusters, rng);
    let cluster_of_label = label_to_set(&cluster_labels, num_classes);
    let mut members: Vec<Vec<usize>> = vec![Vec::new(); clusters];
    for (i, &y) in ids.iter().enumerate() {
        members[cluster_of_label[y as usize]].push(i);
    }
    for rows in &mut members {
        rows.shuffle(rng);
    }
    let gamma = Gamma::new(alpha, 1.0)
        .map_err(|e| DataError::Invalid(format!("dirichlet: alpha = {alpha}: {e}")))?;
    for _ in 0..MAX_DIRICHLET_DRAWS {
        let mut client_rows: Vec<Vec<usize>> = vec![Vec::new(); clients];
        for rows in &members {
            let p = dirichlet_draw(&gamma, clients, rng);
            let counts = multinomial(rows.len(), &p, rng);
            let mut start = 0;
            for (c, &k) in counts.iter().enumerate() {
                client_rows[c].extend_from_slice(&rows[start..start + k]);
                start += k;
            }
        }
        if client_rows.iter().all(|r| usable(r.len(), train_fraction)) {
            let groups_of = vec![None; clients];
            return build(
                pool,
                client_rows,
                &groups_of,
                train_fraction,
                Some(cluster_labels),
                "dirichlet",
                rng,
            );
        }
    }
    Err(DataError::Invalid(format!(
        "dirichlet: {MAX_DIRICHLET_DRAWS} draws with alpha = {alpha} over {} samples all left some of \
         the {clients} clients without a training or test sample; use a larger alpha, fewer \
         clients or more data",
        pool.len()
    )))
}

/// Pathological shards (McMahan et al.): sort by label, cut into `clients * shards_per_client`
/// shards, give each client `shards_per_client` random shards.
///
/// Samples of one label are in random order; shards have `floor(n / (clients ·
/// shards_per_client))` samples (the remainder is left out). No groups are known.
///
/// Errors ([`DataError::Invalid`]): regression labels, `clients == 0`, `shards_per_client == 0`,
/// `train_fraction` outside (0, 1), or a client left with no training or no test sample.
pub fn shards(
    pool: &Dataset,
    clients: usize,
    shards_per_client: usize,
    train_fraction: f64,
    rng: &mut StdRng,
) -> Result<Federation, DataError> {
    let (ids, _) = class_labels(pool, "shards")?;
    check_clients(clients)?;
    check_fraction(train_fraction)?;
    if shards_per_client == 0 {
        return Err(DataError::Invalid(
            "shards: shards_per_client = 0 is outside the allowed range 1..".to_string(),
        ));
    }
    let mut order: Vec<usize> = (0..pool.len()).collect();
    order.shuffle(rng);
    order.sort_by_key(|&i| ids[i]);
    let total = clients * shards_per_client;
    let size = order.len() / total;
    let mut shard_ids: Vec<usize> = (0..total).collect();
    shard_ids.shuffle(rng);
    let client_rows: Vec<Vec<usize>> = shard_ids
        .chunks(shards_per_client)
        .map(|mine| {
            mine.iter()
                .flat_map(|&s| order[s * size..(s + 1) * size].iter().copied())
                .collect()
        })
        .collect();
    build(
        pool,
        client_rows,
        &vec![None; clients],
        train_fraction,
        None,
        "shards",
        rng,
    )
}

/// IID: a uniformly random equal split.
///
/// Each client gets `floor(n / clients)` samples (the remainder is left out). Works for
/// regression data too. No groups are known.
///
/// Errors ([`DataError::Invalid`]): `clients == 0`, `train_fraction` outside (0, 1), or a
/// client left with no training or no test sample.
pub fn iid(
    pool: &Dataset,
    clients: usize,
    train_fraction: f64,
    rng: &mut StdRng,
) -> Result<Federation, DataError> {
    check_clients(clients)?;
    check_fraction(train_fraction)?;
    let mut order: Vec<usize> = (0..pool.len()).collect();
    order.shuffle(rng);
    let size = order.len() / clients;
    let client_rows: Vec<Vec<usize>> = (0..clients)
        .map(|c| order[c * size..(c + 1) * size].to_vec())
        .collect();
    build(
        pool,
        client_rows,
        &vec![None; clients],
        train_fraction,
        None,
        "iid",
        rng,
    )
}

/// FedDisco's NIID-2 (FedDisco spec §5.2): `clients − uniform` biased clients that each hold
/// `classes_per_client` whole classes, then `uniform` clients that hold every class equally,
/// all of (nearly) the same size.
///
/// Biased client `i` holds classes `(c·i + j) mod C` for `j < c` (`c = classes_per_client`;
/// with C = 10, c = 2: classes 2i and 2i + 1, as the official code). Each class's samples are
/// shuffled and cut in client order: every biased holder of the class takes `⌊C/c⌋·shard`
/// samples, then every uniform client `shard`, where `shard` is the largest size every class
/// can supply. So a biased client has `c·⌊C/c⌋·shard` samples and a uniform one `C·shard`
/// (equal when `c` divides `C`); the rest of the pool is left out. Each client then shuffles
/// its samples and keeps `round(train_fraction · n)` for training. No groups are known.
///
/// Errors ([`DataError::Invalid`]): regression labels, `clients == 0`, `uniform > clients`,
/// `classes_per_client` outside `1..=C`, `train_fraction` outside (0, 1), or a class too small
/// to give every client at least one sample.
pub fn biased_uniform(
    pool: &Dataset,
    clients: usize,
    uniform: usize,
    classes_per_client: usize,
    train_fraction: f64,
    rng: &mut StdRng,
) -> Result<Federation, DataError> {
    let (ids, num_classes) = class_labels(pool, "biased_uniform")?;
    check_clients(clients)?;
    check_fraction(train_fraction)?;
    if uniform > clients {
        return Err(DataError::Invalid(format!(
            "biased_uniform: uniform clients = {uniform} is outside the allowed range 0..={clients} (the clients)"
        )));
    }
    if classes_per_client == 0 || classes_per_client > num_classes {
        return Err(DataError::Invalid(format!(
            "biased_uniform: classes per biased client = {classes_per_client} is outside the allowed range 1..={num_classes}"
        )));
    }
    let biased = clients - uniform;
    let classes_of = |i: usize| -> Vec<usize> {
        (0..classes_per_client)
            .map(|j| (classes_per_client * i + j) % num_classes)
            .collect()
    };
    let mut members: Vec<Vec<usize>> = vec![Vec::new(); num_classes];
    for (i, &y) in ids.iter().enumerate() {
        members[y as usize].push(i);
    }
    let mut holders: Vec<Vec<usize>> = vec![Vec::new(); num_classes];
    for i in 0..biased {
        for y in classes_of(i) {
            holders[y].push(i);
        }
    }
    let per_biased = num_classes / classes_per_client;
    let shard = (0..num_classes)
        .filter_map(|y| {
            let demand = holders[y].len() * per_biased + uniform;
            (demand > 0).then(|| members[y].len() / demand)
        })
        .min()
        .unwrap_or(0);
    if shard == 0 {
        return Err(DataError::Invalid(format!(
            "biased_uniform: some class has too few samples to give each of its {clients} clients \
             one ({} samples in all); use more data or fewer clients",
            pool.len()
        )));
    }
    let mut client_rows: Vec<Vec<usize>> = vec![Vec::new(); clients];
    for (y, rows) in members.iter_mut().enumerate() {
        rows.shuffle(rng);
        let mut start = 0;
        let takers = holders[y]
            .iter()
            .map(|&c| (c, per_biased * shard))
            .chain((biased..clients).map(|c| (c, shard)));
        for (c, take) in takers {
            client_rows[c].extend_from_slice(&rows[start..start + take]);
            start += take;
        }
    }
    build(
        pool,
        client_rows,
        &vec![None; clients],
        train_fraction,
        None,
        "biased_uniform",
        rng,
    )
}

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

/// Class ids and class count, or `Invalid` for regression data.
fn class_labels<'a>(pool: &'a Dataset, split: &str) -> Result<(&'a [u32], usize), DataError> {
    match &pool.labels {
        Labels::Class { ids, num_classes } => Ok((ids, *num_classes)),
        Labels::Real(_) => Err(DataError::Invalid(format!(
            "{split}: the data set has real-valued (regression) labels; this split needs class labels"
        ))),
    }
}

fn check_clients(clients: usize) -> Result<(), DataError> {
    if clients == 0 {
        return Err(DataError::Invalid(
            "clients = 0 is outside the allowed range 1..".to_string(),
        ));
    }
    Ok(())
}

fn check_fraction(train_fraction: f64) -> Result<(), DataError> {
    if !(train_fraction > 0.0 && train_fraction < 1.0) {
        return Err(DataError::Invalid(format!(
            "train_fraction = {train_fraction} is outside the allowed range (0, 1)"
        )));
    }
    Ok(())
}

/// Training samples a client with `n` samples keeps.
fn train_count(n: usize, train_fraction: f64) -> usize {
    (train_fraction * n as f64).round() as usize
}

/// True when `n` samples give at least one training and one test sample.
fn usable(n: usize, train_fraction: f64) -> bool {
    let t = train_count(n, train_fraction);
    t >= 1 && t < n
}

/// Labels `0..num_classes` shuffled and cut into `sets` chunks of near-equal size (the first
/// `num_classes % sets` get one more); each chunk sorted.
fn shuffled_label_sets(num_classes: usize, sets: usize, rng: &mut StdRng) -> Vec<Vec<u32>> {
    let mut labels: Vec<u32> = (0..num_classes as u32).collect();
    labels.shuffle(rng);
    let (base, extra) = (num_classes / sets, num_classes % sets);
    let mut out = Vec::with_capacity(sets);
    let mut start = 0;
    for s in 0..sets {
        let len = base + usize::from(s < extra);
        let mut set = labels[start..start + len].to_vec();
        set.sort_unstable();
        out.push(set);
        start += len;
    }
    out
}

/// For each label, the index of the set holding it.
fn label_to_set(sets: &[Vec<u32>], num_classes: usize) -> Vec<usize> {
    let mut of = vec![0; num_classes];
    for (s, labels) in sets.iter().enumerate() {
        for &y in labels {
            of[y as usize] = s;
        }
    }
    of
}

/// Each client's group, uniform at random, re-drawn until every group has a client.
fn assign_groups(clients: usize, groups: usize, rng: &mut StdRng) -> Vec<usize> {
    for _ in 0..MAX_GROUP_DRAWS {
        let a: Vec<usize> = (0..clients).map(|_| rng.random_range(0..groups)).collect();
        let mut seen = vec![false; groups];
        for &g in &a {
            seen[g] = true;
        }
        if seen.iter().all(|&s| s) {
            return a;
        }
    }
    let mut a: Vec<usize> = (0..clients).map(|c| c % groups).collect();
    a.shuffle(rng);
    a
}

/// Proportions ~ Dirichlet(alpha · 1_k), from normalised Gamma(alpha, 1) draws (re-drawn in the
/// rare case that all underflow to 0 for a tiny alpha).
fn dirichlet_draw(gamma: &Gamma<f64>, k: usize, rng: &mut StdRng) -> Vec<f64> {
    loop {
        let g: Vec<f64> = (0..k).map(|_| gamma.sample(rng)).collect();
        let s: f64 = g.iter().sum();
        if s > 0.0 && s.is_finite() {
            return g.into_iter().map(|x| x / s).collect();
        }
    }
}

/// Multinomial(n, p) counts by sequential conditional binomials.
fn multinomial(n: usize, p: &[f64], rng: &mut StdRng) -> Vec<usize> {
    let mut counts = vec![0; p.len()];
    let mut left = n as u64;
    let mut mass = 1.0f64;
    for (c, &pc) in p.iter().enumerate() {
        if left == 0 {
            break;
        }
        if c + 1 == p.len() {
            counts[c] = left as usize;
            break;
        }
        let q = if mass > 0.0 {
            (pc / mass).clamp(0.0, 1.0)
        } else {
            1.0
        };
        let k = Binomial::new(left, q)
            .map(|b| b.sample(rng))
            .unwrap_or(left);
        counts[c] = k as usize;
        left -= k;
        mass -= pc;
    }
    counts
}

/// Per client: shuffle its rows, split `round(train_fraction · n)` / rest into train / test.
fn build(
    pool: &Dataset,
    client_rows: Vec<Vec<usize>>,
    groups_of: &[Option<usize>],
    train_fraction: f64,
    group_labels: Option<Vec<Vec<u32>>>,
    split: &str,
    rng: &mut StdRng,
) -> Result<Federation, DataError> {
    for (c, rows) in client_rows.iter().enumerate() {
        if !usable(rows.len(), train_fraction) {
            return Err(DataError::Invalid(format!(
                "{split}: client {c} gets {} samples, which with train_fraction = {train_fraction} \
                 leaves {} for training and {} for test; each client needs at least 1 of each \
                 (use more data, fewer clients or another train_fraction)",
                rows.len(),
                train_count(rows.len(), train_fraction),
                rows.len() - train_count(rows.len(), train_fraction).min(rows.len()),
            )));
        }
    }
    let clients = client_rows
        .into_iter()
        .zip(groups_of)
        .map(|(mut rows, &group)| {
            rows.shuffle(rng);
            let t = train_count(rows.len(), train_fraction);
            ClientData {
                train: pool.subset(&rows[..t]),
                test: pool.subset(&rows[t..]),
                group,
            }
        })
        .collect();
    Ok(Federation {
        clients,
        group_labels,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use std::collections::{BTreeSet, HashSet};

    /// `n` samples whose single feature is their index; label `i % classes`.
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

    fn pool(n: usize, classes: usize) -> Dataset {
        let ids = (0..n).map(|i| (i % classes) as u32).collect();
        Dataset::new(
            (0..n).map(|i| i as f32).collect(),
            vec![1],
            Labels::Class {
                ids,
                num_classes: classes,
            },
        )
        .unwrap()
    }

    fn rows(d: &Dataset) -> Vec<usize> {
        d.features.iter().map(|&x| x as usize).collect()
    }

    fn labels(d: &Dataset) -> Vec<u32> {
        match &d.labels {
            Labels::Class { ids, .. } => ids.clone(),
            Labels::Real(_) => panic!("real labels"),
        }
    }

    fn rng(seed: u64) -> StdRng {
        StdRng::seed_from_u64(seed)
    }

    /// Asserts no sample is used twice; returns the set of samples used.
    fn assert_disjoint(f: &Federation) -> HashSet<usize> {
        let mut seen = HashSet::new();
        for c in &f.clients {
            for r in rows(&c.train).into_iter().chain(rows(&c.test)) {
                assert!(seen.insert(r), "sample {r} given twice");
            }
        }
        seen
    }

    fn same(a: &Federation, b: &Federation) -> bool {
        a.group_labels == b.group_labels
            && a.clients.len() == b.clients.len()
            && a.clients
                .iter()
                .zip(&b.clients)
                .all(|(x, y)| x.train == y.train && x.test == y.test && x.group == y.group)
    }

    fn assert_invalid<T: std::fmt::Debug>(r: Result<T, DataError>, needles: &[&str]) {
        match r.expect_err("expected an error") {
            DataError::Invalid(msg) => {
                for n in needles {
                    assert!(msg.contains(n), "message lacks {n:?}: {msg}");
                }
            }
            other => panic!("expected Invalid, got {other:?}"),
        }
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

    #[test]
    fn label_groups_structure() {
        let p = pool(1000, 10);
        for (seed, clients, groups) in [(1, 8, 2), (2, 8, 3), (3, 8, 4), (4, 5, 5), (5, 10, 10)] {
            let f = label_groups(&p, clients, groups, 0.8, &mut rng(seed)).unwrap();
            assert_eq!(f.clients.len(), clients);
            let gl = f.group_labels.clone().unwrap();
            assert_eq!(gl.len(), groups);
            // Label sets: disjoint, covering, near-equal.
            let all: Vec<u32> = gl.iter().flatten().copied().collect();
            assert_eq!(
                all.iter().copied().collect::<BTreeSet<_>>(),
                (0..10).collect()
            );
            assert_eq!(all.len(), 10);
            let sizes: Vec<usize> = gl.iter().map(Vec::len).collect();
            assert!(
                sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1,
                "{sizes:?}"
            );
            // Every group has a client; labels stay within the group.
            let groups_of = f.groups().unwrap();
            for g in 0..groups {
                assert!(groups_of.contains(&g), "group {g} empty: {groups_of:?}");
            }
            for c in &f.clients {
                let set = &gl[c.group.unwrap()];
                for y in labels(&c.train).into_iter().chain(labels(&c.test)) {
                    assert!(set.contains(&y), "label {y} outside group {set:?}");
                }
                // 80/20.
                let n = c.train.len() + c.test.len();
                assert_eq!(c.train.len(), (0.8 * n as f64).round() as usize);
            }
            // Disjoint; coverage up to the shard remainders (< clients of the group per group).
            let used = assert_disjoint(&f);
            for (g, set) in gl.iter().enumerate() {
                let members: Vec<&ClientData> =
                    f.clients.iter().filter(|c| c.group == Some(g)).collect();
                let n_g = 100 * set.len();
                let sizes: Vec<usize> = members
                    .iter()
                    .map(|c| c.train.len() + c.test.len())
                    .collect();
                assert!(
                    sizes.iter().all(|&s| s == n_g / members.len()),
                    "unequal shards {sizes:?}"
                );
            }
            assert!(
                used.len() > 1000 - clients,
                "only {} of 1000 samples used",
                used.len()
            );
        }
    }

    #[test]
    fn label_groups_deterministic_and_seed_dependent() {
        let p = pool(600, 10);
        let a = label_groups(&p, 8, 3, 0.8, &mut rng(7)).unwrap();
        let b = label_groups(&p, 8, 3, 0.8, &mut rng(7)).unwrap();
        let c = label_groups(&p, 8, 3, 0.8, &mut rng(8)).unwrap();
        assert!(same(&a, &b));
        assert!(!same(&a, &c));
        // Assignments are random, not a fixed pattern: over seeds several distinct ones appear,
        // including unbalanced ones.
        let assignments: HashSet<Vec<usize>> = (0..20)
            .map(|s| {
                label_groups(&p, 8, 2, 0.8, &mut rng(s))
                    .unwrap()
                    .groups()
                    .unwrap()
            })
            .collect();
        assert!(assignments.len() > 10);
        assert!(
            assignments
                .iter()
                .any(|a| a.iter().filter(|&&g| g == 0).count() != 4)
        );
    }

    #[test]
    fn label_groups_errors() {
        let p = pool(200, 10);
        assert_invalid(
            label_groups(&p, 0, 1, 0.8, &mut rng(0)),
            &["clients = 0", "1.."],
        );
        assert_invalid(
            label_groups(&p, 4, 5, 0.8, &mut rng(0)),
            &["groups = 5", "1..=4"],
        );
        assert_invalid(
            label_groups(&p, 12, 11, 0.8, &mut rng(0)),
            &["groups = 11", "1..=10"],
        );
        assert_invalid(label_groups(&p, 4, 0, 0.8, &mut rng(0)), &["groups = 0"]);
        for bad in [0.0, 1.0, -0.2, 1.5, f64::NAN] {
            assert_invalid(
                label_groups(&p, 4, 2, bad, &mut rng(0)),
                &["train_fraction", "(0, 1)"],
            );
        }
        // 20 samples for 10 clients in 1 group: 2 each, round(1.6) = 2 train, 0 test.
        assert_invalid(
            label_groups(&pool(20, 10), 10, 1, 0.8, &mut rng(0)),
            &["client", "0 for test"],
        );
        let real = Dataset::new(vec![0.0; 10], vec![1], Labels::Real(vec![0.0; 10])).unwrap();
        assert_invalid(label_groups(&real, 2, 1, 0.8, &mut rng(0)), &["regression"]);
    }

    #[test]
    fn dirichlet_structure_and_counts() {
        let p = pool(2000, 10);
        let f = dirichlet(&p, 8, 4, 0.4, 0.8, &mut rng(3)).unwrap();
        assert_eq!(f.clients.len(), 8);
        assert!(f.clients.iter().all(|c| c.group.is_none()));
        let cl = f.group_labels.clone().unwrap();
        assert_eq!(cl.len(), 4);
        let sizes: Vec<usize> = cl.iter().map(Vec::len).collect();
        assert_eq!(sizes.iter().sum::<usize>(), 10);
        assert!(sizes.iter().all(|&s| s == 2 || s == 3), "{sizes:?}");
        assert_eq!(
            cl.iter().flatten().copied().collect::<BTreeSet<_>>(),
            (0..10).collect()
        );
        // Every sample is given out exactly once (multinomial counts sum to the cluster sizes).
        let used = assert_disjoint(&f);
        assert_eq!(used.len(), 2000);
        for c in &f.clients {
            let n = c.train.len() + c.test.len();
            assert!(!c.test.is_empty() && !c.train.is_empty());
            assert_eq!(c.train.len(), (0.8 * n as f64).round() as usize);
        }
        let again = dirichlet(&p, 8, 4, 0.4, 0.8, &mut rng(3)).unwrap();
        assert!(same(&f, &again));
        assert!(!same(
            &f,
            &dirichlet(&p, 8, 4, 0.4, 0.8, &mut rng(4)).unwrap()
        ));
    }

    /// Mean total-variation distance between each client's cluster mixture and the pool's.
    fn heterogeneity(f: &Federation) -> f64 {
        let cl = f.group_labels.as_ref().unwrap();
        let cluster_of = label_to_set(cl, 10);
        let mut total = 0.0;
        for c in &f.clients {
            let ys: Vec<u32> = labels(&c.train)
                .into_iter()
                .chain(labels(&c.test))
                .collect();
            let mut share = vec![0.0; cl.len()];
            for y in &ys {
                share[cluster_of[*y as usize]] += 1.0 / ys.len() as f64;
            }
            let global: Vec<f64> = cl.iter().map(|s| s.len() as f64 / 10.0).collect();
            total += 0.5
                * share
                    .iter()
                    .zip(&global)
                    .map(|(a, b)| (a - b).abs())
                    .sum::<f64>();
        }
        total / f.clients.len() as f64
    }

    #[test]
    fn dirichlet_alpha_controls_heterogeneity() {
        let p = pool(4000, 10);
        let mut low = 0.0;
        let mut high = 0.0;
        for s in 0..5 {
            low += heterogeneity(&dirichlet(&p, 8, 4, 0.1, 0.8, &mut rng(s)).unwrap());
            high += heterogeneity(&dirichlet(&p, 8, 4, 100.0, 0.8, &mut rng(s)).unwrap());
        }
        let (low, high) = (low / 5.0, high / 5.0);
        assert!(low > 0.4, "alpha 0.1 should give skewed clients, TV {low}");
        assert!(
            high < 0.1,
            "alpha 100 should give near-IID clients, TV {high}"
        );
    }

    #[test]
    fn dirichlet_errors() {
        let p = pool(200, 10);
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert_invalid(
                dirichlet(&p, 4, 2, bad, 0.8, &mut rng(0)),
                &["alpha", "(0, ∞)"],
            );
        }
        assert_invalid(
            dirichlet(&p, 4, 0, 0.4, 0.8, &mut rng(0)),
            &["clusters = 0", "1..=10"],
        );
        assert_invalid(
            dirichlet(&p, 4, 11, 0.4, 0.8, &mut rng(0)),
            &["clusters = 11"],
        );
        assert_invalid(dirichlet(&p, 0, 2, 0.4, 0.8, &mut rng(0)), &["clients = 0"]);
        assert_invalid(
            dirichlet(&p, 4, 2, 0.4, 1.0, &mut rng(0)),
            &["train_fraction = 1"],
        );
        // 20 samples, 50 clients: impossible.
        assert_invalid(
            dirichlet(&pool(20, 10), 50, 2, 0.4, 0.8, &mut rng(0)),
            &["alpha = 0.4", "draws"],
        );
        let real = Dataset::new(vec![0.0; 10], vec![1], Labels::Real(vec![0.0; 10])).unwrap();
        assert_invalid(
            dirichlet(&real, 2, 1, 0.4, 0.8, &mut rng(0)),
            &["regression"],
        );
    }

    #[test]
    fn shards_structure() {
        let p = pool(1000, 10);
        let f = shards(&p, 10, 2, 0.8, &mut rng(1)).unwrap();
        assert_eq!(f.clients.len(), 10);
        assert!(f.group_labels.is_none() && f.clients.iter().all(|c| c.group.is_none()));
        let used = assert_disjoint(&f);
        assert_eq!(used.len(), 1000);
        for c in &f.clients {
            assert_eq!(c.train.len() + c.test.len(), 100);
            assert_eq!(c.train.len(), 80);
            // 2 shards of 50 samples, each inside one label (100 samples per label).
            let set: BTreeSet<u32> = labels(&c.train)
                .into_iter()
                .chain(labels(&c.test))
                .collect();
            assert!(set.len() <= 2, "client has labels {set:?}");
        }
        assert!(same(&f, &shards(&p, 10, 2, 0.8, &mut rng(1)).unwrap()));
        assert_invalid(
            shards(&p, 10, 0, 0.8, &mut rng(1)),
            &["shards_per_client = 0"],
        );
        assert_invalid(shards(&p, 600, 1, 0.8, &mut rng(1)), &["client"]);
    }

    #[test]
    fn iid_structure() {
        let p = pool(1003, 10);
        let f = iid(&p, 4, 0.75, &mut rng(2)).unwrap();
        let used = assert_disjoint(&f);
        assert_eq!(used.len(), 1000);
        for c in &f.clients {
            assert_eq!((c.train.len(), c.test.len()), (188, 62));
            assert_eq!(c.group, None);
        }
        assert!(same(&f, &iid(&p, 4, 0.75, &mut rng(2)).unwrap()));
        // Regression data is fine for IID.
        let real = Dataset::new(
            (0..10).map(|i| i as f32).collect(),
            vec![1],
            Labels::Real(vec![0.5; 10]),
        )
        .unwrap();
        let f = iid(&real, 2, 0.8, &mut rng(0)).unwrap();
        assert_eq!(f.clients[0].train.len(), 4);
        assert_invalid(iid(&p, 0, 0.8, &mut rng(0)), &["clients = 0"]);
        assert_invalid(iid(&p, 600, 0.8, &mut rng(0)), &["client 0 gets 1 samples"]);
    }

    #[test]
    fn subsample_fraction() {
        let p = pool(5000, 10);
        let s = subsample(&p, 0.1, &mut rng(9)).unwrap();
        assert_eq!(s.len(), 500);
        let r = rows(&s);
        assert!(
            r.windows(2).all(|w| w[0] < w[1]),
            "distinct, original order"
        );
        assert_eq!(
            labels(&s),
            r.iter().map(|&i| (i % 10) as u32).collect::<Vec<_>>()
        );
        assert_eq!(s, subsample(&p, 0.1, &mut rng(9)).unwrap());
        assert_ne!(s, subsample(&p, 0.1, &mut rng(10)).unwrap());
        assert_eq!(subsample(&p, 1.0, &mut rng(9)).unwrap(), p);
        for bad in [0.0, -0.1, 1.01, f64::NAN] {
            assert_invalid(subsample(&p, bad, &mut rng(0)), &["fraction", "(0, 1]"]);
        }
        assert_invalid(subsample(&pool(3, 3), 0.1, &mut rng(0)), &["keeps none"]);
    }

    #[test]
    fn biased_uniform_is_feddiscos_niid2() {
        let p = pool(6000, 10);
        let f = biased_uniform(&p, 6, 1, 2, 0.8, &mut rng(1)).unwrap();
        assert_disjoint(&f);
        // 600 per class, each held by one biased client (5 shards) and the uniform one (1):
        // shard = 100, and every client has 1000 samples.
        for (i, c) in f.clients.iter().enumerate() {
            let mut counts = c.train.class_counts();
            for (k, t) in counts.iter_mut().zip(c.test.class_counts()) {
                *k += t;
            }
            assert_eq!(counts.iter().sum::<usize>(), 1000, "client {i}");
            if i < 5 {
                let mut want = vec![0; 10];
                want[2 * i] = 500;
                want[2 * i + 1] = 500;
                assert_eq!(counts, want, "client {i}");
            } else {
                assert_eq!(counts, vec![100; 10]);
            }
            assert_eq!(c.train.len(), 800);
        }
        let again = biased_uniform(&p, 6, 1, 2, 0.8, &mut rng(1)).unwrap();
        assert!(same(&f, &again));
        // Many clients: classes wrap around, sizes stay equal.
        let f = biased_uniform(&p, 60, 10, 2, 0.8, &mut rng(2)).unwrap();
        assert_disjoint(&f);
        let sizes: BTreeSet<usize> = f
            .clients
            .iter()
            .map(|c| c.train.len() + c.test.len())
            .collect();
        assert_eq!(sizes.len(), 1, "{sizes:?}");
        assert_invalid(
            biased_uniform(&p, 6, 7, 2, 0.8, &mut rng(1)),
            &["uniform", "7"],
        );
        assert_invalid(
            biased_uniform(&p, 6, 1, 11, 0.8, &mut rng(1)),
            &["11", "1..=10"],
        );
        assert_invalid(
            biased_uniform(&pool(50, 10), 6, 1, 2, 0.8, &mut rng(1)),
            &["too few"],
        );
    }
}
