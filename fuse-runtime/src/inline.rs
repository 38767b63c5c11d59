//! [`Inline`]: a few values on the stack, more on the heap, so that a call allocates nothing.

/// `len` values, on the stack when there are at most `N`, else on the heap.
#[derive(Clone)]
pub(crate) struct Inline<T, const N: usize> {
    stack: [T; N],
    heap: Vec<T>,
    len: usize,
}

impl<T: Copy, const N: usize> Inline<T, N> {
    /// `len` copies of `value`.
    pub(crate) fn new(value: T, len: usize) -> Inline<T, N> {
        let heap = match len > N {
            true => vec![value; len],
            false => Vec::new(),
        };
        Inline {
            stack: [value; N],
            heap,
            len,
        }
    }

    pub(crate) fn as_slice(&self) -> &[T] {
        match self.stack.get(..self.len) {
            Some(stack) => stack,
            None => &self.heap,
        }
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [T] {
        match self.stack.get_mut(..self.len) {
            Some(stack) => stack,
            None => &mut self.heap,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn few_stay_on_the_stack() {
        let mut few = Inline::<u64, 4>::new(7, 3);
        assert_eq!(few.as_mut_slice(), [7, 7, 7]);
        assert!(few.heap.is_empty(), "nothing allocated");
        few.as_mut_slice()[1] = 2;
        assert_eq!(few.as_slice(), [7, 2, 7]);
        assert!(Inline::<u64, 4>::new(0, 0).as_slice().is_empty());
    }

    #[test]
    fn more_spill_to_the_heap() {
        let mut many = Inline::<u64, 4>::new(1, 5);
        many.as_mut_slice()[4] = 2;
        assert_eq!(many.as_slice(), [1, 1, 1, 1, 2]);
        assert_eq!(many.heap, [1, 1, 1, 1, 2]);
    }
}
