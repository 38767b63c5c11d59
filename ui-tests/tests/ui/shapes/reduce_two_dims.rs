use fuse_runtime::fuse;

fuse! {
    // GroupNorm's statistics reduce over `(c, s)` at once: the dims in the operand's order.
    fn f(x: [f32; n, c, s]) -> [f32; n] {
        mean(x, (s, c))
    }

    // They stand together in the operand.
    fn g(x: [f32; c, n, s]) -> [f32; n] {
        sum(x, (c, s))
    }

    // A position is along one dim.
    fn h(x: [f32; n, c, s]) -> [u32; n] {
        argmax(x, (c, s))
    }

    // A tensor with one of the dims reduced together is differentiated where it is read
    // whole (GroupNorm's weight), not through a slice.
    #[vjp(x, w)]
    fn k(x: [f32; n, c, s], w: [f32; c]) -> [f32; n, c, s] {
        (x - mean(x, (c, s))) * w
    }
    #[vjp(x, w)]
    fn k2(x: [f32; n, c, s], w: [f32; c, 2 * e]) -> [f32; n, c, s, e] {
        (x - mean(x, (c, s))) * w[.., ..e]
    }
}

fn main() {}
