//! A property test of the wire decoder (peer and coordinator messages), the fuzz target of issue
//! 4 ("hostile and broken peers"):
//! random bytes, truncations and bit flips of valid frames of every message type go through
//! `protocol::read_frame` and `protocol::decode` exactly as the codec runs them. They must give an error
//! (or, for bit flips and random bytes, possibly another valid message), never panic, and never
//! allocate beyond what was received: a global allocator in this test binary records the largest
//! single allocation while a frame is decoded.
//!
//! Runs 10 000 cases per property with a fixed seed (a few seconds). More, or other seeds:
//! `FEDERICO_FUZZ_CASES=100000 FEDERICO_FUZZ_SEED=7 cargo test --release --test wire_fuzz`
//! (`FEDERICO_FUZZ_SEED=random` draws one; a failure prints the shrunk input).

use federico::coord::PairDistance;
use federico::protocol::{
    self, CollabRequest, CollabResponse, CoordRequest, CoordResponse, GradientRequest,
    GradientResponse, ModelPayload, ModelRequest, ModelResponse,
};
use libp2p::futures::executor::block_on;
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestRunner};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;

/// The system allocator, noting the largest request made on the current thread.
struct Tracking;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    let _ = LARGEST.try_with(|c| c.set(c.get().max(size)));
}

// SAFETY: every call is forwarded unchanged to `System`; `note` does not allocate.
unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Tracking = Tracking;

/// The node's default bound: a header may announce up to 256 MiB and must still cost only what
/// arrives.
const MAX: u64 = protocol::DEFAULT_MAX_MESSAGE;

/// What one frame may cost: buffers grow by doubling, and serde preallocates at most 1 MiB for a
/// sequence whatever length it announces.
fn allowance(input: usize) -> usize {
    (2 << 20) + 4 * input
}

/// Reads and decodes `bytes` as the codec does, and checks the allocation bound.
fn decode_frame<M: DeserializeOwned>(bytes: &[u8]) -> Result<Result<M, String>, TestCaseError> {
    LARGEST.with(|c| c.set(0));
    let result = block_on(protocol::read_frame(&mut &bytes[..], MAX))
        .map_err(|e| e.to_string())
        .and_then(|body| protocol::decode::<M>(&body).map_err(|e| e.to_string()));
    let largest = LARGEST.with(Cell::get);
    prop_assert!(
        largest <= allowance(bytes.len()),
        "decoding {} bytes allocated {largest} bytes at once",
        bytes.len()
    );
    Ok(result)
}

fn cases() -> u32 {
    std::env::var("FEDERICO_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}

fn runner() -> TestRunner {
    let seed = match std::env::var("FEDERICO_FUZZ_SEED").ok().as_deref() {
        Some("random") => RngSeed::Random,
        Some(s) => RngSeed::Fixed(s.parse().expect("FEDERICO_FUZZ_SEED: a number or random")),
        None => RngSeed::Fixed(0x5EED_F00D),
    };
    TestRunner::new(Config {
        cases: cases(),
        rng_seed: seed,
        failure_persistence: None,
        ..Config::default()
    })
}

fn floats() -> impl Strategy<Value = Vec<f32>> {
    // Any bit pattern, NaN and infinities included: the decoder must carry them, the checks
    // after it refuse them.
    vec(any::<u32>().prop_map(f32::from_bits), 0..300)
}

fn model_request() -> impl Strategy<Value = ModelRequest> {
    prop_oneof![
        any::<u64>().prop_map(|round| ModelRequest::Pull { round }),
        any::<u64>().prop_map(|round| ModelRequest::Notice { round }),
        any::<u64>().prop_map(|version| ModelRequest::Fetch { version }),
        Just(ModelRequest::Done),
    ]
}

fn model_response() -> impl Strategy<Value = ModelResponse> {
    prop_oneof![
        Just(ModelResponse::Ack),
        (any::<u64>(), any::<u64>(), floats()).prop_map(|(version, fingerprint, params)| {
            ModelResponse::Model(ModelPayload {
                version,
                fingerprint,
                params: Arc::new(params),
            })
        }),
    ]
}

fn gradient_request() -> impl Strategy<Value = GradientRequest> {
    prop_oneof![
        (
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            any::<u64>().prop_map(f64::from_bits),
            floats()
        )
            .prop_map(|(version, fingerprint, n_train, weight, grad)| {
                GradientRequest::Gradient {
                    version,
                    fingerprint,
                    n_train,
                    weight,
                    grad,
                }
            }),
        any::<u64>().prop_map(|version| GradientRequest::Skip { version }),
    ]
}

fn gradient_response() -> impl Strategy<Value = GradientResponse> {
    prop_oneof![
        Just(GradientResponse::Accepted),
        vec(any::<char>(), 0..60).prop_map(|c| GradientResponse::Rejected {
            reason: c.into_iter().collect()
        }),
    ]
}

fn doubles() -> impl Strategy<Value = Vec<f64>> {
    vec(any::<u64>().prop_map(f64::from_bits), 0..40)
}

/// Every coordinator request (FedDisco, HCCT, FedSaC): the coordinator decodes them from any
/// member, so they get the same treatment.
fn coord_request() -> impl Strategy<Value = CoordRequest> {
    prop_oneof![
        (any::<u64>(), any::<u64>().prop_map(f64::from_bits)).prop_map(|(n_train, d)| {
            CoordRequest::Register {
                n_train,
                discrepancy: d,
            }
        }),
        any::<u64>().prop_map(|round| CoordRequest::Fetch { round }),
        (any::<u64>(), floats(), any::<u64>()).prop_map(|(round, p, n_train)| {
            CoordRequest::Update {
                round,
                params: Arc::new(p),
                n_train,
            }
        }),
        any::<u64>().prop_map(|n_train| CoordRequest::Join { n_train }),
        (
            any::<u64>(),
            floats(),
            proptest::option::of(vec(doubles(), 0..5))
        )
            .prop_map(|(round, p, subspace)| CoordRequest::Contribute {
                round,
                params: Arc::new(p),
                subspace,
            }),
        vec(
            (
                any::<u32>(),
                proptest::option::of(any::<u64>().prop_map(f64::from_bits)),
                any::<u32>()
            ),
            0..8
        )
        .prop_map(|v| CoordRequest::Distances {
            pairs: v
                .into_iter()
                .map(|(partner, distance, rounds)| PairDistance {
                    partner,
                    distance,
                    rounds,
                })
                .collect(),
        }),
    ]
}

fn maybe_acc() -> impl Strategy<Value = Option<f64>> {
    proptest::option::of(any::<u64>().prop_map(f64::from_bits))
}

/// FedCollab's silo-to-silo messages: every silo decodes them from any member.
fn collab_request() -> impl Strategy<Value = CollabRequest> {
    prop_oneof![
        (any::<u32>(), floats(), maybe_acc()).prop_map(|(round, w, acc)| {
            CollabRequest::DiscStep {
                round,
                weights: Arc::new(w),
                acc,
            }
        }),
        (any::<u32>(), maybe_acc())
            .prop_map(|(rounds, acc)| CollabRequest::DiscDone { rounds, acc }),
        any::<u64>().prop_map(|round| CollabRequest::Model { round }),
    ]
}

fn collab_response() -> impl Strategy<Value = CollabResponse> {
    prop_oneof![
        (floats(), maybe_acc()).prop_map(|(w, acc)| CollabResponse::DiscStep {
            weights: Arc::new(w),
            acc,
        }),
        (any::<u64>(), floats()).prop_map(|(round, p)| CollabResponse::Model {
            round,
            params: Arc::new(p),
        }),
        Just(CollabResponse::Ack),
        Just(CollabResponse::Restart),
        vec(any::<char>(), 0..60).prop_map(|c| CollabResponse::NotReady {
            reason: c.into_iter().collect()
        }),
        vec(any::<char>(), 0..60).prop_map(|c| CollabResponse::Error {
            reason: c.into_iter().collect()
        }),
    ]
}

fn coord_response() -> impl Strategy<Value = CoordResponse> {
    prop_oneof![
        (any::<u64>(), floats()).prop_map(|(round, p)| CoordResponse::Global {
            round,
            params: Arc::new(p)
        }),
        (
            any::<u64>(),
            floats(),
            proptest::option::of(floats()),
            any::<bool>()
        )
            .prop_map(|(round, p, d, train)| CoordResponse::Assigned {
                round,
                params: Arc::new(p),
                direction: d.map(Arc::new),
                train,
            }),
        Just(CoordResponse::Ack),
        vec(any::<char>(), 0..60).prop_map(|c| CoordResponse::Error {
            reason: c.into_iter().collect()
        }),
        (
            any::<u64>().prop_map(f64::from_bits),
            any::<u32>(),
            vec(any::<u32>(), 0..8)
        )
            .prop_map(|(target, nodes, members)| CoordResponse::DiscPlan {
                target,
                nodes,
                members
            }),
        (vec(any::<u32>(), 0..8), vec(any::<u64>(), 0..8))
            .prop_map(|(members, sizes)| CoordResponse::Coalition { members, sizes }),
        Just(CoordResponse::Alone),
    ]
}

/// A valid frame and a mutation of it.
#[derive(Clone, Debug)]
enum Mutation {
    /// Keep the first `n` bytes (n < len).
    Cut(usize),
    /// Keep the first `n` body bytes and rewrite the header to announce exactly them.
    CutBody(usize),
    /// Flip these bits (positions taken modulo the frame's bit length).
    Flip(Vec<usize>),
    /// Replace the body with these bytes, header announcing them.
    Body(Vec<u8>),
    /// Send these bytes, header and all.
    Raw(Vec<u8>),
    /// Insert a varint announcing `claim` (a length that lies) at this body offset, taken
    /// modulo the body length; the header announces the new body.
    Lie(usize, u64),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        any::<usize>().prop_map(Mutation::Cut),
        any::<usize>().prop_map(Mutation::CutBody),
        vec(any::<usize>(), 1..8).prop_map(Mutation::Flip),
        vec(any::<u8>(), 0..600).prop_map(Mutation::Body),
        vec(any::<u8>(), 0..600).prop_map(Mutation::Raw),
        (any::<usize>(), any::<u64>()).prop_map(|(at, claim)| Mutation::Lie(at, claim)),
    ]
}

fn with_header(body: &[u8]) -> Vec<u8> {
    let mut f = (body.len() as u64).to_le_bytes().to_vec();
    f.extend_from_slice(body);
    f
}

/// The property for one message type.
fn check<M>(strategy: impl Strategy<Value = M>)
where
    M: Serialize + DeserializeOwned + std::fmt::Debug,
{
    runner()
        .run(&(strategy, mutation()), |(msg, m)| {
            let frame = protocol::encode(&msg).unwrap();
            // The valid frame decodes to what was sent (compared encoded: NaN != NaN).
            let back = decode_frame::<M>(&frame)?.map_err(TestCaseError::fail)?;
            prop_assert_eq!(protocol::encode(&back).unwrap(), frame.clone());
            let body_len = frame.len() - 8;
            match m {
                Mutation::Cut(n) => {
                    let n = n % frame.len();
                    prop_assert!(decode_frame::<M>(&frame[..n])?.is_err(), "cut at {}", n);
                }
                Mutation::CutBody(n) => {
                    // bincode is prefix-free for a fixed type: a strict prefix never decodes.
                    if body_len > 0 {
                        let n = n % body_len;
                        let cut = with_header(&frame[8..8 + n]);
                        prop_assert!(decode_frame::<M>(&cut)?.is_err(), "body cut at {}", n);
                    }
                }
                Mutation::Flip(bits) => {
                    let mut f = frame.clone();
                    for b in bits {
                        let b = b % (8 * f.len());
                        f[b / 8] ^= 1 << (b % 8);
                    }
                    // Another valid message is possible (a flipped parameter); a panic or a
                    // large allocation is not.
                    if let Ok(other) = decode_frame::<M>(&f)? {
                        let len = protocol::encode(&other).unwrap().len();
                        prop_assert!(len <= f.len() + 16, "{} bytes from {}", len, f.len());
                    }
                }
                Mutation::Body(bytes) => {
                    let _ = decode_frame::<M>(&with_header(&bytes))?;
                }
                Mutation::Raw(bytes) => {
                    let _ = decode_frame::<M>(&bytes)?;
                }
                Mutation::Lie(at, claim) => {
                    let at = at % (body_len + 1);
                    let mut body = frame[8..8 + at].to_vec();
                    body.push(253); // bincode's varint marker for a u64
                    body.extend(claim.to_le_bytes());
                    body.extend(&frame[8 + at..]);
                    let _ = decode_frame::<M>(&with_header(&body))?;
                }
            }
            Ok(())
        })
        .unwrap();
}

#[test]
fn model_requests_survive_random_bytes_truncation_and_bit_flips() {
    check(model_request());
}

#[test]
fn model_responses_survive_random_bytes_truncation_and_bit_flips() {
    check(model_response());
}

#[test]
fn gradient_requests_survive_random_bytes_truncation_and_bit_flips() {
    check(gradient_request());
}

#[test]
fn gradient_responses_survive_random_bytes_truncation_and_bit_flips() {
    check(gradient_response());
}

#[test]
fn coordinator_requests_survive_random_bytes_truncation_and_bit_flips() {
    check(coord_request());
}

#[test]
fn coordinator_responses_survive_random_bytes_truncation_and_bit_flips() {
    check(coord_response());
}

#[test]
fn fedcollab_requests_survive_random_bytes_truncation_and_bit_flips() {
    check(collab_request());
}

#[test]
fn fedcollab_responses_survive_random_bytes_truncation_and_bit_flips() {
    check(collab_response());
}

#[test]
fn lengths_that_lie_cost_nothing() {
    // Vectors and strings that announce 2^31..2^64 elements behind a valid header: refused,
    // within the allocation bound (checked in decode_frame).
    for claim in [1u64 << 31, 1 << 40, 1 << 60, u64::MAX] {
        let mut varint = vec![253u8];
        varint.extend(claim.to_le_bytes());
        // ModelResponse::Model { version 1, fingerprint 1, params: <claim> }
        let body = [&[0u8, 1, 1][..], &varint, &[0u8; 16]].concat();
        assert!(
            decode_frame::<ModelResponse>(&with_header(&body))
                .unwrap()
                .is_err()
        );
        // GradientRequest::Gradient { 1, 1, 1, weight 0.0, grad: <claim> }
        let body = [&[0u8, 1, 1, 1][..], &[0u8; 8], &varint, &[0u8; 16]].concat();
        assert!(
            decode_frame::<GradientRequest>(&with_header(&body))
                .unwrap()
                .is_err()
        );
        // GradientResponse::Rejected { reason: <claim> }
        let body = [&[1u8][..], &varint, b"short"].concat();
        assert!(
            decode_frame::<GradientResponse>(&with_header(&body))
                .unwrap()
                .is_err()
        );
    }
    // A header announcing the whole bound with 10 bytes behind it.
    let mut f = MAX.to_le_bytes().to_vec();
    f.extend([0u8; 10]);
    assert!(decode_frame::<ModelResponse>(&f).unwrap().is_err());
}
