//! Unit tests of `scenario` (moved unchanged from its inline `mod tests`).
//! Owns: the module's unit tests and their fixtures.
//! Must not: hold code the module itself uses.

use super::*;
use crate::core::MStep;

#[test]
fn defaults_are_the_papers() {
    let s = Scenario::parse("").unwrap();
    assert_eq!(s.federico.neighbours, 3);
    assert_eq!(s.federico.epsilon, 0.3);
    assert_eq!(s.federico.beta, 0.6);
    assert_eq!(s.train.lr, 0.01);
}

#[test]
fn feddisco_defaults_are_the_specs() {
    let s = Scenario::parse("algorithms = [\"feddisco\"]\n").unwrap();
    let f = &s.feddisco;
    assert_eq!((f.a, f.b, f.normalise), (0.5, 0.1, true));
    assert_eq!(f.metric, crate::coord::feddisco::Metric::Kl);
    assert_eq!(
        (f.local_epochs, f.lr, f.momentum, f.weight_decay),
        (10, 0.01, 0.9, 1e-5)
    );
    let e = Scenario::parse("[feddisco]\nalpha = 1\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("alpha") && e.contains("local_epochs"), "{e}");
    let e = Scenario::parse("[feddisco]\nmetric = \"js\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("js") && e.contains("cosine"), "{e}");
}

#[test]
fn fedsac_defaults_are_the_papers() {
    let s = Scenario::parse("algorithms = [\"fedsac\"]\n").unwrap();
    let f = &s.fedsac;
    assert_eq!(
        (f.alpha, f.beta, f.alpha_cutoff, f.k, f.lambda),
        (0.9, 1.4, 0.7, 3, 0.01)
    );
    assert_eq!(
        (f.local_steps, f.lr, f.momentum, f.weight_decay),
        (200, 0.01, 0.9, 1e-5)
    );
    assert_eq!((f.cohort_size, f.feature_samples), (10, 1000));
    assert_eq!(f.reg_sign, crate::coord::fedsac::RegSign::Attract);
    let e = Scenario::parse("[fedsac]\ngamma = 1\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("gamma") && e.contains("alpha"), "{e}");
    let e = Scenario::parse("[fedsac]\nreg_sign = \"up\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("attract") && e.contains("repel"), "{e}");
}

#[test]
fn unknown_field_is_named_with_the_allowed_ones() {
    let e = Scenario::parse("[federico]\nepsilom = 0.2\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("epsilom") && e.contains("epsilon"), "{e}");
    let e = Scenario::parse("roundz = 3\n").unwrap_err().to_string();
    assert!(e.contains("roundz") && e.contains("rounds"), "{e}");
}

#[test]
fn bad_enum_value_lists_allowed_values() {
    let e = Scenario::parse("algorithms = [\"fedprox\"]\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("fedprox") && e.contains("federico"), "{e}");
    let e = Scenario::parse("[split]\nkind = \"random\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("label_groups") && e.contains("dirichlet"), "{e}");
}

#[test]
fn out_of_range_values_name_the_field() {
    for (text, field) in [
        ("[federico]\nepsilon = 1.5\n", "federico.epsilon"),
        ("[federico]\nbeta = 0\n", "federico.beta"),
        ("[federico]\nloss_scale = \"median\"\n", "loss_scale"),
        ("[federico]\nloss_scale = -2\n", "loss_scale"),
        (
            "[federico]\nsoften = { from_round = 5, factor = 0 }\n",
            "soften.factor",
        ),
        (
            "[federico]\nsoften = { from_round = 5, scale = 0.5 }\n",
            "scale",
        ),
        ("rounds = 0\n", "rounds"),
        ("[split]\nclients = 2\ngroups = 3\n", "split.groups"),
        ("[split]\ntrain_fraction = 1.0\n", "split.train_fraction"),
        ("[train]\nlr = -0.1\n", "train.lr"),
        ("[feddisco]\na = -0.5\n", "feddisco.a"),
        ("[feddisco]\nlocal_epochs = 0\n", "feddisco.local_epochs"),
        ("[feddisco]\nsize_cap = 0.5\n", "feddisco.size_cap"),
        ("[feddisco]\nupdate_clip = -1\n", "feddisco.update_clip"),
        ("[feddisco]\nweight_cap = 0.5\n", "feddisco.weight_cap"),
        ("[feddisco]\nmomentum = 1.0\n", "feddisco.momentum"),
        (
            "[feddisco]\nclients_per_round = 9\n",
            "feddisco.clients_per_round",
        ),
        ("[privacy]\nepsilon = 0\n", "privacy.epsilon"),
        ("[privacy]\ndelta = 1.5\n", "privacy.delta"),
        ("[privacy]\nclip = -1\n", "privacy.clip"),
        (
            "[privacy]\nnoise_multiplier = 0\n",
            "privacy.noise_multiplier",
        ),
        ("[privacy]\nloss_clip = inf\n", "privacy.loss_clip"),
        (
            "[privacy]\nepsilon = 8\n",
            "[privacy] is built for federico only",
        ),
        (
            "algorithms = [\"federico\"]\n[federico]\nmstep = \"local_epoch\"\n[privacy]\nepsilon = 8\n",
            "mstep = \"local_epoch\" is not built",
        ),
        ("[fedsac]\nalpha = -1\n", "fedsac.alpha"),
        ("[fedsac]\nk = 0\n", "fedsac.k"),
        ("[fedsac]\nfeature_samples = 3\n", "fedsac.feature_samples"),
        ("[fedsac]\nlr = 0\n", "fedsac.lr"),
        ("[fedsac]\nupdate_clip = 0.5\n", "fedsac.update_clip"),
        ("[fedsac]\ntrim = 0.5\n", "fedsac.trim"),
        ("[feddisco]\ntrim = -0.1\n", "feddisco.trim"),
        (
            "[feddisco]\naggregator = \"bulyan\"\n",
            "unknown variant `bulyan`",
        ),
        (
            "[hcct]\nupdate_clip = 0.5\n",
            "update_clip must be 0 (off) or at least 1",
        ),
        ("[hcct]\ntrim = 0.9\n", "trim must be in [0, 0.5)"),
        (
            "[hcct]\nefficient = true\naggregator = \"median\"\n",
            "not with efficient",
        ),
        (
            "algorithms = [\"fedsac\"]\n[data]\nsource = \"sine\"\n[model]\nkind = \"linear\"\n",
            "class labels",
        ),
        (
            "[data]\nsource = \"mnist\"\n[split]\nkind = \"biased_uniform\"\nuniform_clients = 9\n",
            "split.uniform_clients",
        ),
        ("[data]\nsource = \"sine\"\n", "model.kind"),
        ("[fedcollab]\ncapacity = -2\n", "fedcollab.capacity"),
        (
            "[fedcollab]\ndisc_max_rounds = 0\n",
            "fedcollab.disc_max_rounds",
        ),
        (
            "[split]\nkind = \"cluster4\"\nclients = 6\ngroups = 2\n",
            "split.clients",
        ),
        ("[split]\nquantity_decay = -1\n", "split.quantity_decay"),
    ] {
        let e = Scenario::parse(text).unwrap_err().to_string();
        assert!(e.contains(field), "{text:?} gave {e}");
    }
}

#[test]
fn fedcollab_section_defaults_and_unknown_fields() {
    let s = Scenario::parse("algorithms = [\"fedcollab\"]\n").unwrap();
    assert_eq!(s.algorithms, vec![Algorithm::Fedcollab]);
    assert_eq!(s.fedcollab, FedCollabConfig::default());
    assert_eq!(s.fedcollab.capacity, 10.0);
    let s = Scenario::parse("[fedcollab]\ncapacity = 8\ndistance = \"label_tv\"\n").unwrap();
    assert_eq!(s.fedcollab.capacity, 8.0);
    let e = Scenario::parse("[fedcollab]\ncapacityy = 8\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("capacityy") && e.contains("capacity"), "{e}");
    let e = Scenario::parse("[fedcollab]\ndistance = \"euclid\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("discriminator") && e.contains("label_tv"), "{e}");
}

#[test]
fn loss_scale_and_mstep_forms() {
    let s = Scenario::parse("[federico]\nloss_scale = 50\nmstep = { minibatch = 4 }\n").unwrap();
    assert_eq!(s.federico.loss_scale(), crate::core::LossScale::Fixed(50.0));
    assert_eq!(s.federico.mstep(), MStep::Minibatch(4));
    let s = Scenario::parse("[federico]\nloss_scale = \"sum\"\nmstep = \"epoch\"\n").unwrap();
    assert_eq!(s.federico.loss_scale(), crate::core::LossScale::Sum);
    let s = Scenario::parse("[federico]\nloss_scale = \"auto\"\n").unwrap();
    assert_eq!(s.federico.loss_scale, Some(crate::core::LossScale::Auto));
    assert_eq!(s.federico.mstep(), MStep::Epoch);
    let s = Scenario::parse("[federico]\nmstep = \"local_epoch\"\n").unwrap();
    assert_eq!(s.federico.mstep(), MStep::LocalEpoch);
    assert_eq!(
        (
            MStep::LocalEpoch.sub_steps(19),
            MStep::LocalEpoch.own_steps(19)
        ),
        (None, Some(19)),
        "one exchange a round, an epoch of the owner's own sub-steps"
    );
    let s = Scenario::parse_with(
        "",
        &["federico.soften={ from_round = 3, factor = 0.25 }".into()],
    )
    .unwrap();
    assert_eq!(
        s.federico.soften(2),
        Some(crate::core::Soften {
            from_round: 3,
            factor: 0.25
        })
    );
}

#[test]
fn overrides_set_nested_fields_and_are_validated() {
    let s = Scenario::parse_with(
        "[federico]\nepsilon = 0.3\n",
        &[
            "federico.loss_scale=10".into(),
            "seeds=[4, 5]".into(),
            "data.source=sine".into(),
            "model.kind=linear".into(),
        ],
    )
    .unwrap();
    assert_eq!(s.federico.loss_scale(), crate::core::LossScale::Fixed(10.0));
    assert_eq!(s.seeds, vec![4, 5]);
    assert_eq!(s.data.source, Source::Sine);
    let e = Scenario::parse_with("", &["federico.epsilon=2".into()])
        .unwrap_err()
        .to_string();
    assert!(e.contains("federico.epsilon"), "{e}");
    let e = Scenario::parse_with("", &["federico.epsilom=0.1".into()])
        .unwrap_err()
        .to_string();
    assert!(e.contains("epsilom"), "{e}");
    assert!(Scenario::parse_with("", &["rounds".into()]).is_err());
}

#[test]
fn hcct_section_defaults_forms_and_errors() {
    use crate::coord::hcct::{Alpha, Optimizer};
    let s = Scenario::parse("algorithms = [\"hcct\"]\n").unwrap();
    assert_eq!(s.algorithms, vec![Algorithm::Hcct]);
    assert_eq!(Algorithm::Hcct.name(), "hcct");
    assert_eq!(s.hcct, HcctConfig::default());
    let s = Scenario::parse(
        "[hcct]\nalpha = 25\nepochs = 5\noptimizer = \"adam\"\ngroups = 3\none_shot = true\n",
    )
    .unwrap();
    assert_eq!(s.hcct.alpha, Alpha::Constant(25.0));
    assert_eq!((s.hcct.epochs, s.hcct.groups), (5, Some(3)));
    assert_eq!(s.hcct.optimizer, Optimizer::Adam);
    assert!(s.hcct.one_shot);
    let s = Scenario::parse("[hcct]\nalpha = \"client_size\"\n").unwrap();
    assert_eq!(s.hcct.alpha, Alpha::ClientSize);
    for (text, needle) in [
        ("[hcct]\nalpah = 1\n", "alpah"),
        ("[hcct]\nalpha = -1\n", "alpha must be a finite number >= 0"),
        ("[hcct]\nalpha = \"big\"\n", "\"big\""),
        (
            "[hcct]\nepochs = 0\n",
            "hcct.epochs must be at least 1, got 0",
        ),
        (
            "[hcct]\nlr_decay = 0\n",
            "hcct.lr_decay must be in (0, 1], got 0",
        ),
        ("[hcct]\nlr = -0.1\n", "hcct.lr must be"),
        (
            "[hcct]\ngroups = 0\n",
            "hcct.groups must be at least 1, got 0",
        ),
        ("[hcct]\noptimizer = \"sgdm\"\n", "sgd"),
    ] {
        let e = Scenario::parse(text).unwrap_err().to_string();
        assert!(e.contains(needle), "{text:?} gave {e}");
    }
}

#[test]
fn cnn_spec_from_cifar_shape() {
    let s = Scenario::parse(
        "[data]\nsource = \"cifar10\"\n[model]\nkind = \"cnn\"\nconv = [128, 128, 128]\n",
    )
    .unwrap();
    let spec = s.model_spec(&[3, 32, 32], Some(10)).unwrap();
    assert!(matches!(spec, ModelSpec::Cnn { channels: 3, .. }));
}

#[test]
fn missing_data_dir_says_what_to_do() {
    let s = Scenario::parse("[data]\nsource = \"fashion_mnist\"\n").unwrap();
    let e = s.load_real(None).unwrap_err().to_string();
    assert!(e.contains("--data-dir") && e.contains(DATA_DIR_ENV), "{e}");
}
