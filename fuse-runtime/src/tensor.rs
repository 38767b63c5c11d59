//! What a generated kernel takes for a tensor: [`AnyBuffer`] (any element type, as the runtime
//! checks and launches it) and [`Input`] and [`Output`] (typed, as the generated signatures take
//! them). [`Buffer`] implements them here; the views of foreign memory in `view.rs`.

use crate::buffer::Buffer;
use crate::device::Device;
use crate::element::Element;
use crate::error::Error;

pub(crate) mod sealed {
    /// Implemented by [`Buffer`](crate::Buffer) here and by the views in `view.rs`.
    pub trait Sealed {}
    impl<T: crate::Element> Sealed for crate::Buffer<T> {}
}

/// A buffer of any element type, as [`bind`](crate::__private::bind) and [`launch`](crate::__private::launch) see it.
/// Sealed: [`Buffer`], [`BufferView`](crate::BufferView) and
/// [`BufferViewMut`](crate::BufferViewMut) implement it.
pub trait AnyBuffer: sealed::Sealed + Sync {
    /// The buffer's shape.
    fn shape(&self) -> &[usize];
    /// The device it lives on.
    fn device(&self) -> &Device;
    /// The device address of its first element, or `None` on the CPU.
    fn device_address(&self) -> Option<u64>;
    /// The bytes its elements take on the device.
    fn bytes(&self) -> usize;
    /// Where its elements are, as (the start of the memory, the byte range within it): two
    /// tensors overlap when they have the same start and their ranges meet. On a GPU the start
    /// is 0 (one address space) and the range is the device addresses; on the CPU the start
    /// identifies the storage and the range is the whole of it. `None` when it holds nothing.
    fn span(&self) -> Option<(usize, std::ops::Range<u64>)>;
}

impl<T: Element> AnyBuffer for Buffer<T> {
    fn shape(&self) -> &[usize] {
        Buffer::shape(self)
    }

    fn device(&self) -> &Device {
        Buffer::device(self)
    }

    fn device_address(&self) -> Option<u64> {
        Buffer::device_address(self)
    }

    fn bytes(&self) -> usize {
        self.len() * std::mem::size_of::<T::Repr>()
    }

    fn span(&self) -> Option<(usize, std::ops::Range<u64>)> {
        Buffer::span(self)
    }
}

/// What a generated kernel takes for a tensor parameter of element type `T`: a [`Buffer<T>`],
/// a [`BufferView<T>`](crate::BufferView) or a [`BufferViewMut<T>`](crate::BufferViewMut). Sealed.
pub trait Input<T: Element>: AnyBuffer {
    /// A copy of the elements, in row-major order (for the CPU backend).
    #[doc(hidden)]
    fn read(&self) -> Result<Vec<T>, Error>;
}

/// What a generated kernel writes an output of element type `T` into (`name::into`): a
/// [`Buffer<T>`] or a [`BufferViewMut<T>`](crate::BufferViewMut). Sealed.
pub trait Output<T: Element>: Input<T> {
    /// Replaces every element with `data` (for the CPU backend).
    #[doc(hidden)]
    fn write(&mut self, data: Vec<T>) -> Result<(), Error>;
}

impl<T: Element> Input<T> for Buffer<T> {
    fn read(&self) -> Result<Vec<T>, Error> {
        self.to_vec()
    }
}

impl<T: Element> Output<T> for Buffer<T> {
    fn write(&mut self, data: Vec<T>) -> Result<(), Error> {
        self.replace(data)
    }
}
