//! How algorithms are named in figures: the names papers use (FedAvg+, FedeRiCo, …).
//! Owns: [`display_name`], the one place an algorithm's display name is written, and
//! [`display_label`], which maps a run file's algorithm name (`federico`) to it.
//! Must not: change the names in files and tables (`Algorithm::name`, the serde form).

use crate::scenario::Algorithm;

/// The algorithm's name as papers write it.
pub fn display_name(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::Local => "Local",
        Algorithm::Fedavg => "FedAvg",
        Algorithm::FedavgPlus => "FedAvg+",
        Algorithm::Federico => "FedeRiCo",
        Algorithm::Fedcollab => "FedCollab",
        Algorithm::Hcct => "HCCT",
        Algorithm::Feddisco => "FedDisco",
        Algorithm::Fedsac => "FedSaC",
    }
}

/// The display name of the algorithm that run files call `name`; a name no algorithm has is
/// shown as it is.
pub fn display_label(name: &str) -> String {
    serde_json::from_value::<Algorithm>(serde_json::Value::String(name.to_string()))
        .map(|a| display_name(a).to_string())
        .unwrap_or_else(|_| name.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_algorithm_has_a_distinct_display_name_reached_from_its_file_name() {
        let all = [
            Algorithm::Local,
            Algorithm::Fedavg,
            Algorithm::FedavgPlus,
            Algorithm::Federico,
            Algorithm::Fedcollab,
            Algorithm::Hcct,
            Algorithm::Feddisco,
            Algorithm::Fedsac,
        ];
        let shown: Vec<String> = all.iter().map(|a| display_label(a.name())).collect();
        assert_eq!(
            shown,
            [
                "Local",
                "FedAvg",
                "FedAvg+",
                "FedeRiCo",
                "FedCollab",
                "HCCT",
                "FedDisco",
                "FedSaC"
            ]
        );
        let mut distinct = shown.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), all.len());
    }

    #[test]
    fn unknown_names_are_shown_as_given() {
        assert_eq!(display_label("my_variant"), "my_variant");
        assert_eq!(display_label(""), "");
    }
}
