//! Parameter and gradient vectors on the wire: one block of little-endian `f32` bytes.
//!
//! Owns: the encoding of every `f32` vector a protocol carries (models, gradients,
//! discriminator weights): a byte length, then the values' little-endian bytes, copied as one
//! block each way. Serde's default encodes a vector element by element; for the 159k-parameter
//! models of the Fashion-MNIST scenarios that cost a node more CPU per message than its
//! encryption.
//! Must not: check the values (length, finiteness): [`super::check_vector`] does, after
//! decoding, as for any untrusted input.

use serde::de::{self, Visitor};
use serde::{Deserializer, Serializer};
use std::fmt;
use std::sync::Arc;

/// A vector of `f32` that can be written as one block.
pub(crate) trait Floats {
    fn floats(&self) -> &[f32];
}

impl Floats for [f32] {
    fn floats(&self) -> &[f32] {
        self
    }
}

impl Floats for Vec<f32> {
    fn floats(&self) -> &[f32] {
        self
    }
}

impl Floats for Arc<Vec<f32>> {
    fn floats(&self) -> &[f32] {
        self
    }
}

/// Serializes `v` as its little-endian bytes.
pub(crate) fn serialize<S: Serializer, V: Floats + ?Sized>(v: &V, s: S) -> Result<S::Ok, S::Error> {
    let v = v.floats();
    if cfg!(target_endian = "little") {
        s.serialize_bytes(bytemuck::cast_slice(v))
    } else {
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        s.serialize_bytes(&bytes)
    }
}

/// Deserializes a vector written by [`serialize`]; a byte count that is not a multiple of 4
/// is refused.
pub(crate) fn deserialize<'de, D: Deserializer<'de>, V: From<Vec<f32>>>(
    d: D,
) -> Result<V, D::Error> {
    d.deserialize_bytes(FloatsVisitor).map(V::from)
}

struct FloatsVisitor;

impl<'de> Visitor<'de> for FloatsVisitor {
    type Value = Vec<f32>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the little-endian bytes of f32 values")
    }

    fn visit_bytes<E: de::Error>(self, bytes: &[u8]) -> Result<Vec<f32>, E> {
        if bytes.len() % 4 != 0 {
            return Err(E::invalid_length(bytes.len(), &self));
        }
        Ok(bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
}

/// The same for an optional vector.
pub(crate) mod option {
    use super::Floats;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use std::sync::Arc;

    struct Ref<'a>(&'a [f32]);

    impl Serialize for Ref<'_> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            super::serialize(self.0, s)
        }
    }

    #[derive(Deserialize)]
    struct Owned(#[serde(deserialize_with = "super::deserialize")] Vec<f32>);

    pub(crate) fn serialize<S: Serializer>(
        v: &Option<Arc<Vec<f32>>>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        v.as_ref().map(|v| Ref(v.floats())).serialize(s)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Arc<Vec<f32>>>, D::Error> {
        Ok(Option::<Owned>::deserialize(d)?.map(|o| Arc::new(o.0)))
    }
}

#[cfg(test)]
mod tests {
    use crate::protocol::{GradientRequest, ModelPayload, ModelResponse, decode, encode};
    use std::sync::Arc;

    #[test]
    fn a_model_is_its_header_and_its_little_endian_bytes() {
        let params = vec![1.5f32, -0.0, f32::MIN_POSITIVE, 3.25];
        let msg = ModelResponse::Model(ModelPayload {
            version: 2,
            fingerprint: 9,
            params: Arc::new(params.clone()),
        });
        let frame = encode(&msg).unwrap();
        let body = &frame[8..];
        let raw: Vec<u8> = params.iter().flat_map(|x| x.to_le_bytes()).collect();
        assert!(body.ends_with(&raw), "the values are one block at the end");
        assert_eq!(
            body.len(),
            raw.len() + 4,
            "variant, version, fingerprint, byte length"
        );
        let back: ModelResponse = decode(body).unwrap();
        assert_eq!(back, msg);
    }

    #[test]
    fn a_byte_count_that_is_not_whole_floats_is_refused() {
        let g = GradientRequest::Gradient {
            version: 1,
            fingerprint: 2,
            n_train: 3,
            weight: 0.5,
            grad: vec![1.0; 3],
        };
        let frame = encode(&g).unwrap();
        let mut body = frame[8..].to_vec();
        // The byte length (12) is the byte before the values; claim 11 and drop a byte.
        let at = body.len() - 13;
        assert_eq!(body[at], 12);
        body[at] = 11;
        body.pop();
        assert!(decode::<GradientRequest>(&body).is_err());
    }
}
