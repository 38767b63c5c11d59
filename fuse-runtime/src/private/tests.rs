//! Tests of `bind`, `shape_of`, `alloc` and the host access functions.

use super::*;
use crate::kernel::KernelInfo;
use DimRef::{Fixed, Named};

/// `layernorm(x: [rows, cols], gamma: [cols], beta: [cols]) -> y: [rows, cols]`.
const LAYERNORM: Signature = Signature {
    kernel: "layernorm",
    dims: &["rows", "cols"],
    tensors: &[
        TensorSig {
            name: "x",
            dims: &[Named(0), Named(1)],
            output: false,
        },
        TensorSig {
            name: "gamma",
            dims: &[Named(1)],
            output: false,
        },
        TensorSig {
            name: "beta",
            dims: &[Named(1)],
            output: false,
        },
        TensorSig {
            name: "y",
            dims: &[Named(0), Named(1)],
            output: true,
        },
    ],
};

/// `rotate(q: [n, 4]) -> (out: [n, 4], total: [])`.
const ROTATE: Signature = Signature {
    kernel: "rotate",
    dims: &["n"],
    tensors: &[
        TensorSig {
            name: "q",
            dims: &[Named(0), Fixed(4)],
            output: false,
        },
        TensorSig {
            name: "out",
            dims: &[Named(0), Fixed(4)],
            output: true,
        },
        TensorSig {
            name: "total",
            dims: &[],
            output: true,
        },
    ],
};

fn cpu() -> Device {
    Device::cpu()
}

fn zeros(shape: &[usize]) -> Buffer<f32> {
    cpu().zeros(shape).unwrap()
}

#[test]
fn binds_shared_dims() {
    let (x, g, b, y) = (zeros(&[7, 33]), zeros(&[33]), zeros(&[33]), zeros(&[7, 33]));
    let dims = bind(&LAYERNORM, &cpu(), &[&x, &g, &b, &y]).unwrap();
    assert_eq!(dims, [7, 33]);
    assert_eq!(shape_of(&LAYERNORM, 3, &dims), [7, 33]);
    assert_eq!(shape_of(&LAYERNORM, 1, &dims), [33]);
    assert!(shape_of(&LAYERNORM, 9, &dims).is_empty());
}

#[test]
fn binds_from_the_inputs_alone() {
    // Generated code binds the inputs first, to size the outputs it then allocates.
    let (x, g, b) = (zeros(&[3, 17]), zeros(&[17]), zeros(&[17]));
    let dims = bind(&LAYERNORM, &cpu(), &[&x, &g, &b]).unwrap();
    assert_eq!(dims, [3, 17]);
    let y = alloc::<f32>(&cpu(), &shape_of(&LAYERNORM, 3, &dims)).unwrap();
    assert_eq!(bind(&LAYERNORM, &cpu(), &[&x, &g, &b, &y]).unwrap(), dims);
    let short = zeros(&[16]);
    let err = bind(&LAYERNORM, &cpu(), &[&x, &short, &b]).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Shape {
                found: 16,
                expected: 17,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn shared_dim_mismatch_names_both_parameters() {
    let (x, g, b, y) = (zeros(&[5, 32]), zeros(&[31]), zeros(&[32]), zeros(&[5, 32]));
    let err = bind(&LAYERNORM, &cpu(), &[&x, &g, &b, &y]).unwrap_err();
    assert_eq!(
        err,
        Error::Shape {
            kernel: "layernorm".into(),
            param: "gamma".into(),
            dim: "cols".into(),
            expected: 32,
            found: 31,
            bound_by: Some("x".into()),
        }
    );
    assert_eq!(
        err.to_string(),
        "kernel `layernorm`: parameter `gamma` has `cols` = 31, but `x` bound `cols` = 32"
    );
}

#[test]
fn rank_mismatch() {
    let (x, g, b, y) = (
        zeros(&[5 * 32]),
        zeros(&[32]),
        zeros(&[32]),
        zeros(&[5, 32]),
    );
    let err = bind(&LAYERNORM, &cpu(), &[&x, &g, &b, &y]).unwrap_err();
    assert_eq!(
        err,
        Error::Rank {
            kernel: "layernorm".into(),
            param: "x".into(),
            expected: 2,
            found: 1
        }
    );
    assert_eq!(
        err.to_string(),
        "kernel `layernorm`: parameter `x` has rank 1, but the signature declares rank 2"
    );
}

#[test]
fn outputs_must_agree_with_inputs() {
    let (x, g, b, y) = (zeros(&[5, 32]), zeros(&[32]), zeros(&[32]), zeros(&[6, 32]));
    let err = bind(&LAYERNORM, &cpu(), &[&x, &g, &b, &y]).unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, Error::Shape { ref param, .. } if param == "y"),
        "{text}"
    );
    assert_eq!(
        text,
        "kernel `layernorm`: parameter `y` has `rows` = 6, but `x` bound `rows` = 5"
    );
}

#[test]
fn fixed_dims() {
    let (q, out, total) = (zeros(&[9, 4]), zeros(&[9, 4]), zeros(&[]));
    assert_eq!(bind(&ROTATE, &cpu(), &[&q, &out, &total]).unwrap(), [9]);
    assert_eq!(shape_of(&ROTATE, 1, &[9]), [9, 4]);
    assert!(
        shape_of(&ROTATE, 2, &[9]).is_empty(),
        "a scalar has the shape []"
    );

    let bad = zeros(&[9, 3]);
    let err = bind(&ROTATE, &cpu(), &[&bad, &out, &total]).unwrap_err();
    assert_eq!(
        err,
        Error::Shape {
            kernel: "rotate".into(),
            param: "q".into(),
            dim: "axis 1 (fixed size 4)".into(),
            expected: 4,
            found: 3,
            bound_by: None,
        }
    );
    assert_eq!(
        err.to_string(),
        "kernel `rotate`: parameter `q` has size 3 on axis 1 (fixed size 4), but the signature \
         requires 4"
    );
}

#[test]
fn scalar_output_rank() {
    let (q, out, not_scalar) = (zeros(&[9, 4]), zeros(&[9, 4]), zeros(&[1]));
    let err = bind(&ROTATE, &cpu(), &[&q, &out, &not_scalar]).unwrap_err();
    assert_eq!(
        err,
        Error::Rank {
            kernel: "rotate".into(),
            param: "total".into(),
            expected: 0,
            found: 1
        }
    );
}

#[test]
fn empty_dims_bind_to_zero() {
    let (x, g, b, y) = (zeros(&[0, 3]), zeros(&[3]), zeros(&[3]), zeros(&[0, 3]));
    assert_eq!(bind(&LAYERNORM, &cpu(), &[&x, &g, &b, &y]).unwrap(), [0, 3]);
}

#[test]
fn wrong_tensor_count_is_an_internal_error() {
    let x = zeros(&[2, 2]);
    let err = bind(&LAYERNORM, &cpu(), &[&x]).unwrap_err();
    assert!(matches!(err, Error::Internal { .. }), "{err}");
}

#[test]
fn unbound_dim_is_an_internal_error() {
    const ODD: Signature = Signature {
        kernel: "odd",
        dims: &["n", "never"],
        tensors: &[TensorSig {
            name: "a",
            dims: &[Named(0)],
            output: false,
        }],
    };
    let a = zeros(&[3]);
    let err = bind(&ODD, &cpu(), &[&a]).unwrap_err();
    assert!(err.to_string().contains("`never`"), "{err}");
}

#[test]
fn alloc_and_host_access() {
    let dev = cpu();
    let mut out = alloc::<i64>(&dev, &[3, 5]).unwrap();
    assert_eq!((out.shape(), out.len()), (&[3, 5][..], 15));
    let data: Vec<i64> = (0..15).map(|i| i * 7919 - 50_000).collect();
    host_write(&mut out, data.clone()).unwrap();
    assert_eq!(host_read(&out).unwrap(), data);
    let err = host_write(&mut out, vec![1; 14]).unwrap_err();
    assert_eq!(
        err,
        Error::Length {
            op: "host_write",
            expected: 15,
            found: 14
        }
    );
    assert!(is_cpu(&dev));
    assert_eq!(alloc::<bool>(&dev, &[]).unwrap().to_vec().unwrap(), [false]);
}

#[test]
fn launch_on_cpu_is_an_error_not_a_panic() {
    static KERNEL: KernelInfo = KernelInfo {
        name: "k",
        symbol: "fuse_k",
        source: "",
        cubins: &[],
    };
    let x = zeros(&[3]);
    let args = [crate::launch::Arg::Buffer(&x), crate::launch::Arg::Dim(3)];
    let err = crate::launch::launch(
        &cpu(),
        &KERNEL,
        crate::grid::Geometry::Map {
            elems: 3,
            vectors: 1,
        },
        &args,
    )
    .unwrap_err();
    assert_eq!(err, Error::NotCuda { kernel: "k".into() });
}

/// Philox's rounds keyed as a kernel keys them, by `round_key` (round 0 the seed itself), give
/// the words of `random::philox4x32_10`, on random seeds and counters.
#[test]
fn round_keys_give_philoxs_words() {
    let mut x = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
        | 1;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for _ in 0..1000 {
        let (seed, lo, hi) = (next(), next(), next());
        let counter = [lo as u32, (lo >> 32) as u32, hi as u32, (hi >> 32) as u32];
        let [mut c0, mut c1, mut c2, mut c3] = counter;
        assert_eq!(round_key(seed, 0), seed);
        for i in 0..10 {
            let key = round_key(seed, i);
            let p0 = u64::from(0xD251_1F53u32) * u64::from(c0);
            let p1 = u64::from(0xCD9E_8D57u32) * u64::from(c2);
            [c0, c1, c2, c3] = [
                (p1 >> 32) as u32 ^ c1 ^ key as u32,
                p1 as u32,
                (p0 >> 32) as u32 ^ c3 ^ (key >> 32) as u32,
                p0 as u32,
            ];
        }
        let want = crate::random::philox4x32_10(counter, [seed as u32, (seed >> 32) as u32]);
        assert_eq!(
            [c0, c1, c2, c3],
            want,
            "seed {seed:#x}, counter {counter:x?}"
        );
    }
}

#[test]
fn an_output_sharing_memory_with_a_tensor_is_an_error() {
    let dev = cpu();
    let x = dev
        .upload(&[1.5f32, -2.0, 3.25, 4.0, 0.5, 6.0])
        .unwrap()
        .reshape(&[2, 3])
        .unwrap();
    let gamma = dev.upload(&[1.0f32, 2.0, 3.0]).unwrap();
    let beta = dev.upload(&[0.5f32, 0.25, 0.125]).unwrap();
    let y = x.reshape(&[2, 3]).unwrap(); // the same memory as `x`
    let err = bind(&LAYERNORM, &dev, &[&x, &gamma, &beta, &y]).unwrap_err();
    assert_eq!(
        err,
        Error::Alias {
            kernel: "layernorm".into(),
            output: "y".into(),
            other: "x".into()
        }
    );
    assert_eq!(
        err.to_string(),
        "kernel `layernorm`: output `y` shares memory with `x`; write the output into a buffer \
         of its own"
    );
    // Two outputs on one buffer: `split(x: [n]) -> (a: [n], b: [n])`.
    const SPLIT: Signature = Signature {
        kernel: "split",
        dims: &["n"],
        tensors: &[
            TensorSig {
                name: "x",
                dims: &[Named(0)],
                output: false,
            },
            TensorSig {
                name: "a",
                dims: &[Named(0)],
                output: true,
            },
            TensorSig {
                name: "b",
                dims: &[Named(0)],
                output: true,
            },
        ],
    };
    let input = dev.upload(&[1u16, 2, 3]).unwrap();
    let a = dev.zeros::<u16>(&[3]).unwrap();
    let b = a.reshape(&[3]).unwrap();
    let err = bind(&SPLIT, &dev, &[&input, &a, &b]).unwrap_err();
    assert!(
        matches!(&err, Error::Alias { output, other, .. } if output == "b" && other == "a"),
        "{err}"
    );
    let b = dev.zeros::<u16>(&[3]).unwrap();
    bind(&SPLIT, &dev, &[&input, &a, &b]).unwrap();
    // The inputs alone (the allocating form binds them before it allocates) are not checked.
    bind(&SPLIT, &dev, &[&input]).unwrap();
    // Distinct buffers, and an input used twice, are fine.
    let y = dev.zeros::<f32>(&[2, 3]).unwrap();
    bind(&LAYERNORM, &dev, &[&x, &gamma, &gamma, &y]).unwrap();
}

/// `rotary(x: [t, 2 * half + p], cos: [t, half]) -> y: [t, p]`: `half` from `cos`, `p` what
/// `x`'s second axis leaves.
const PARTS: Signature = Signature {
    kernel: "rotary",
    dims: &["t", "half", "p"],
    tensors: &[
        TensorSig {
            name: "x",
            dims: &[Named(0), DimRef::Sum(&[(2, Named(1)), (1, Named(2))])],
            output: false,
        },
        TensorSig {
            name: "cos",
            dims: &[Named(0), Named(1)],
            output: false,
        },
        TensorSig {
            name: "y",
            dims: &[Named(0), Named(2)],
            output: true,
        },
    ],
};

#[test]
fn a_sum_of_parts_binds_its_one_unbound_dim_and_checks_its_size() {
    let (x, cos) = (zeros(&[3, 37]), zeros(&[3, 16]));
    let dims = bind(&PARTS, &cpu(), &[&x, &cos]).unwrap();
    assert_eq!(dims, [3, 16, 5]);
    assert_eq!(shape_of(&PARTS, 0, &dims), [3, 37]);
    assert_eq!(DimRef::Sum(&[(2, Named(1)), (1, Named(2))]).size(&dims), 37);
    // Shorter than its parts `2 * half`: no size of `p` fits.
    let err = bind(&PARTS, &cpu(), &[&zeros(&[3, 31]), &cos]).unwrap_err();
    assert!(
        matches!(&err, Error::Shape { found: 31, expected: 32, dim, .. } if dim.contains("2 * half + p")),
        "{err}"
    );
    // With the output, `p` is bound by `x` and checked against `y`.
    let err = bind(&PARTS, &cpu(), &[&x, &cos, &zeros(&[3, 4])]).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Shape {
                found: 4,
                expected: 5,
                ..
            }
        ),
        "{err}"
    );
}

/// `backward(dy: [r, c], mask: packed bits of [r, c]) -> dx: [r, c]`: the mask's one axis holds
/// `r * c / 32` words, rounded up, and binds nothing.
const WORDS: Signature = Signature {
    kernel: "backward",
    dims: &["r", "c"],
    tensors: &[
        TensorSig {
            name: "dy",
            dims: &[Named(0), Named(1)],
            output: false,
        },
        TensorSig {
            name: "mask",
            dims: &[DimRef::Words(&[Named(0), Named(1)])],
            output: false,
        },
        TensorSig {
            name: "dx",
            dims: &[Named(0), Named(1)],
            output: true,
        },
    ],
};

#[test]
fn packed_bits_take_a_word_for_each_32_elements() {
    let dy = zeros(&[7, 11]);
    let words = cpu().zeros::<u32>(&[3]).unwrap();
    let dims = bind(&WORDS, &cpu(), &[&dy, &words]).unwrap();
    assert_eq!(dims, [7, 11]);
    // 77 elements: two full words and 13 bits of a third.
    assert_eq!(shape_of(&WORDS, 1, &dims), [3]);
    assert_eq!(DimRef::Words(&[Named(0), Named(1)]).size(&[8, 4]), 1);
    assert_eq!(DimRef::Words(&[Named(0), Named(1)]).size(&[0, 4]), 0);
    let err = bind(&WORDS, &cpu(), &[&dy, &cpu().zeros::<u32>(&[2]).unwrap()]).unwrap_err();
    assert!(
        matches!(&err, Error::Shape { found: 2, expected: 3, dim, param, .. }
            if dim.contains("words") && dim.contains("[r, c]") && param == "mask"),
        "{err}"
    );
}
