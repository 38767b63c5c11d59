//! The element types a [`Buffer`](crate::Buffer) can hold.

use std::borrow::Cow;
use std::fmt::Debug;

use cudarc::driver::{DeviceRepr, ValidAsZeroBits};

pub(crate) mod sealed {
    use super::*;

    /// The device side of an element type; only this crate can implement it.
    ///
    /// Device memory holds `Repr`, a type for which every bit pattern is valid, so reading
    /// memory a kernel wrote can never produce an invalid Rust value. For most types `Repr` is
    /// the type itself; `bool` is stored as `u8` and read back as `byte != 0`.
    pub trait Sealed: Sized {
        /// The type stored in device memory.
        type Repr: DeviceRepr + ValidAsZeroBits + Copy + Default + Send + Sync + Unpin + 'static;

        /// Host values as device representations, borrowed when they are the same type.
        fn to_repr(data: &[Self]) -> Cow<'_, [Self::Repr]>;

        /// Device representations read back as host values.
        fn from_repr(data: Vec<Self::Repr>) -> Vec<Self>;
    }
}

/// A type that can be an element of a [`Buffer`](crate::Buffer): `f32`, `f64`,
/// [`f16`](struct@crate::f16), [`bf16`](crate::bf16), [`F8E4M3`](crate::F8E4M3),
/// [`F8E5M2`](crate::F8E5M2), `i8`, `u8`, `i16`, `u16`, `i32`, `u32`, `i64`,
/// `u64` and `bool`.
///
/// The trait is sealed; the list can grow without breaking code that uses it.
///
/// ```
/// use fuse_runtime::Element;
/// assert_eq!(<f32 as Element>::NAME, "f32");
/// assert_eq!(Element::to_bits(1.5f32), 0x3fc0_0000u64);
/// assert_eq!(Element::to_bits(-1i32), 0xffff_ffffu64);
/// assert_eq!(Element::to_bits(true), 1u64);
/// assert_eq!(Element::to_bits(fuse_runtime::f16::ONE), 0x3c00u64);
/// ```
pub trait Element:
    sealed::Sealed + Copy + Default + Debug + PartialEq + PartialOrd + Send + Sync + 'static
{
    /// The type's Rust name, such as `"f32"`.
    const NAME: &'static str;

    /// The value's bytes in the low bytes of a `u64` (little-endian), zero-extended: the form
    /// a scalar kernel argument takes (see `__private::Arg::Scalar`).
    ///
    /// Call it as `Element::to_bits(x)`: for `f32` and `f64`, `x.to_bits()` is the inherent
    /// method, which returns the float's own bit type.
    fn to_bits(self) -> u64;
}

/// Implements [`Element`] for a plain number type that is its own device representation.
macro_rules! number {
    ($t:ty, $to_bits:expr) => {
        impl sealed::Sealed for $t {
            type Repr = $t;

            fn to_repr(data: &[Self]) -> Cow<'_, [Self::Repr]> {
                Cow::Borrowed(data)
            }

            fn from_repr(data: Vec<Self::Repr>) -> Vec<Self> {
                data
            }
        }

        impl Element for $t {
            const NAME: &'static str = stringify!($t);

            fn to_bits(self) -> u64 {
                let to_bits: fn($t) -> u64 = $to_bits;
                to_bits(self)
            }
        }
    };
}

number!(f32, |v| u64::from(v.to_bits()));
number!(f64, |v| v.to_bits());
number!(i8, |v| u64::from(v as u8));
number!(u8, u64::from);
number!(i16, |v| u64::from(v as u16));
number!(u16, u64::from);
number!(i32, |v| u64::from(v as u32));
number!(u32, u64::from);
number!(i64, |v| v as u64);
number!(u64, |v| v);

/// Implements [`Element`] for a 16-bit float of the `half` crate, stored on the device as its
/// bits (`u16`): kernels read and write the bits and compute in f32.
macro_rules! half_float {
    ($t:ident) => {
        impl sealed::Sealed for half::$t {
            type Repr = u16;

            fn to_repr(data: &[Self]) -> Cow<'_, [u16]> {
                Cow::Borrowed(bytemuck::cast_slice(data))
            }

            fn from_repr(data: Vec<u16>) -> Vec<Self> {
                data.into_iter().map(half::$t::from_bits).collect()
            }
        }

        impl Element for half::$t {
            const NAME: &'static str = stringify!($t);

            fn to_bits(self) -> u64 {
                u64::from(half::$t::to_bits(self))
            }
        }
    };
}

half_float!(f16);
half_float!(bf16);

/// Implements [`Element`] for an fp8 type of the `float8` crate, stored on the device as its
/// bits (`u8`): kernels read and write the bits and compute in f32.
macro_rules! fp8 {
    ($t:ident) => {
        impl sealed::Sealed for float8::$t {
            type Repr = u8;

            fn to_repr(data: &[Self]) -> Cow<'_, [u8]> {
                Cow::Borrowed(bytemuck::cast_slice(data))
            }

            fn from_repr(data: Vec<u8>) -> Vec<Self> {
                data.into_iter().map(float8::$t::from_bits).collect()
            }
        }

        impl Element for float8::$t {
            const NAME: &'static str = stringify!($t);

            fn to_bits(self) -> u64 {
                u64::from(float8::$t::to_bits(&self))
            }
        }
    };
}

fp8!(F8E4M3);
fp8!(F8E5M2);

impl sealed::Sealed for bool {
    type Repr = u8;

    fn to_repr(data: &[Self]) -> Cow<'_, [u8]> {
        Cow::Owned(data.iter().map(|&b| u8::from(b)).collect())
    }

    fn from_repr(data: Vec<u8>) -> Vec<Self> {
        data.into_iter().map(|byte| byte != 0).collect()
    }
}

impl Element for bool {
    const NAME: &'static str = "bool";

    fn to_bits(self) -> u64 {
        u64::from(self)
    }
}

#[cfg(test)]
mod tests {
    use super::sealed::Sealed;
    use super::*;

    #[test]
    fn bits_are_low_bytes() {
        assert_eq!(Element::to_bits(1.0f32), 0x3f80_0000);
        assert_eq!(Element::to_bits(-0.0f32), 0x8000_0000, "no sign extension");
        assert_eq!(Element::to_bits(-2.5f64), 0xc004_0000_0000_0000);
        assert_eq!(Element::to_bits(-1i32), 0xffff_ffff);
        assert_eq!(Element::to_bits(-1i64), u64::MAX);
        assert_eq!(Element::to_bits(-1i8), 0xff, "zero-extended");
        assert_eq!(Element::to_bits(-2i16), 0xfffe);
        assert_eq!(Element::to_bits(200u8), 200);
        assert_eq!(Element::to_bits(65535u16), 0xffff);
        assert_eq!(Element::to_bits(-half::f16::ONE), 0xbc00);
        assert_eq!(Element::to_bits(half::bf16::ONE), 0x3f80);
        assert_eq!(Element::to_bits(-float8::F8E4M3::ONE), 0xb8);
        assert_eq!(Element::to_bits(float8::F8E5M2::ONE), 0x3c);
        assert_eq!(Element::to_bits(7u32), 7);
        assert_eq!(Element::to_bits(u64::MAX - 1), u64::MAX - 1);
        assert_eq!(Element::to_bits(true), 1);
        assert_eq!(Element::to_bits(false), 0);
    }

    #[test]
    fn bool_reads_any_nonzero_byte_as_true() {
        assert_eq!(
            bool::from_repr(vec![0, 1, 2, 255]),
            [false, true, true, true]
        );
        assert_eq!(&*bool::to_repr(&[true, false]), &[1u8, 0]);
    }

    #[test]
    fn halfs_are_stored_as_their_bits() {
        let x = [half::f16::from_f32(1.5), half::f16::NEG_INFINITY];
        assert_eq!(&*half::f16::to_repr(&x), &[0x3e00u16, 0xfc00]);
        assert_eq!(
            half::bf16::from_repr(vec![0x3fc0]),
            [half::bf16::from_f32(1.5)]
        );
    }

    #[test]
    fn fp8s_are_stored_as_their_bits() {
        let x = [
            float8::F8E4M3::from_f32(1.5),
            float8::F8E4M3::from_bits(0xff),
        ];
        assert_eq!(&*float8::F8E4M3::to_repr(&x), &[0x3cu8, 0xff]);
        assert_eq!(
            float8::F8E5M2::from_repr(vec![0x3e]),
            [float8::F8E5M2::from_f32(1.5)]
        );
    }

    #[test]
    fn names() {
        let names = [
            f32::NAME,
            f64::NAME,
            i8::NAME,
            u8::NAME,
            i16::NAME,
            u16::NAME,
            i32::NAME,
            u32::NAME,
            i64::NAME,
            u64::NAME,
            bool::NAME,
            half::f16::NAME,
            half::bf16::NAME,
            float8::F8E4M3::NAME,
            float8::F8E5M2::NAME,
        ];
        assert_eq!(
            names,
            [
                "f32", "f64", "i8", "u8", "i16", "u16", "i32", "u32", "i64", "u64", "bool", "f16",
                "bf16", "F8E4M3", "F8E5M2"
            ]
        );
    }
}
