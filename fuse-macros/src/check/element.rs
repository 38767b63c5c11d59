//! Constant indexing, `w[0]` and `w[1][2]`: one element of a tensor parameter whose dims all
//! have a fixed size, picked by integer literals, so that every index is checked against its dim
//! here and the element is the same for every element of the launch (a scalar).

use crate::check::typing::operand;
use crate::check::Checker;
use crate::ir::{Dim, Op};
use crate::parse::{Expr, Index};
use crate::ty::Ty;
use proc_macro2::TokenStream;

impl Checker<'_> {
    /// `base[i][j]..`: the element of the tensor parameter `base` at those indices.
    pub fn element(&mut self, base: &Expr, indices: &[Index], t: &TokenStream) -> Option<usize> {
        let id = self.expr(base)?;
        let Op::Load(p) = self.nodes[id].op else {
            let what = match self.nodes[id].shape.is_empty() {
                true => "a scalar, which has no elements to pick",
                false => "a computed value; index a tensor parameter and compute with the element",
            };
            self.cx.spanned(
                &base.tokens,
                format!(
                    "only a tensor parameter can be indexed, as in `w[0]` with `w: [f32; 3]`, and `{}` is {what}",
                    operand(&base.tokens)
                ),
            );
            return None;
        };
        let name = crate::ir::plain_name(&self.params[p].name);
        let shape = self.params[p]
            .shape
            .clone()
            .expect("a loaded parameter is a tensor");
        if indices.len() != shape.len() {
            self.rank_mismatch(&name, &shape, indices, t);
            return None;
        }
        // `x[0]` along a named dim: a gather by the literal, zero where the dim is empty.
        if let ([d], [index]) = (&shape[..], indices) {
            if !matches!(self.dims[*d], Dim::Fixed(_)) {
                return self.slice(base, &[index.as_gather()], t);
            }
        }
        let mut offset = 0u64;
        for (&d, index) in shape.iter().zip(indices) {
            let size = match self.dims[d] {
                Dim::Fixed(size) => size,
                Dim::Named(_) | Dim::Composite(_) | Dim::Merged(_) => {
                    let dim = self.dims[d].text(&self.dims);
                    self.cx.spanned(&index.tokens, format!("`{name}` is indexed along `{dim}`, a dim whose size is known only at launch; `w[i][j]` picks from dims of fixed size, as in `w[0][1]` with `w: [f32; 3, 4]`: along `{dim}`, pick with a slice of one index, as in `{name}[{}]`, which reads zero past the end", self.pick_example(&shape, d)));
                    return None;
                }
            };
            if index.value >= size {
                self.cx.spanned(&index.tokens, format!("index out of bounds: this dim of `{name}` has size {size} but the index is {}", index.value));
                return None;
            }
            // A fixed dim that was refused (a suffixed literal) stands in as `u64::MAX`: its error
            // is out already. Other sizes whose product passes 64 bits hold no buffer.
            let Some(next) = offset
                .checked_mul(size)
                .and_then(|o| o.checked_add(index.value))
            else {
                if size != u64::MAX {
                    self.cx.spanned(
                        &index.tokens,
                        format!("`{name}` has more elements than a 64-bit index reaches"),
                    );
                }
                return None;
            };
            offset = next;
        }
        let elem = self.params[p].elem;
        Some(self.push(Op::Element(p, offset), Ty::Elem(elem), vec![], t))
    }

    /// A slice of a tensor of `shape` that picks element 0 along `d`, for messages.
    fn pick_example(&self, shape: &[usize], d: usize) -> String {
        let items: Vec<&str> = shape
            .iter()
            .map(|&x| if x == d { "0" } else { ".." })
            .collect();
        items.join(", ")
    }

    /// Reports a tensor indexed by more or fewer indices than it has dims.
    fn rank_mismatch(&mut self, name: &str, shape: &[usize], indices: &[Index], t: &TokenStream) {
        let (rank, given) = (shape.len(), indices.len());
        let example: String = (0..rank).map(|_| "[0]").collect();
        let dims = if rank == 1 { "dim" } else { "dims" };
        let message = format!(
            "`{name}` has {rank} {dims}, `{}`, but is indexed by {given}: index every dim to pick one element, as in `{name}{example}`",
            self.shape_text(shape)
        );
        self.cx.spanned(t, message);
    }
}

#[cfg(test)]
mod tests {
    use crate::ir::Op;
    use crate::testing::{assert_error, errors, kernel};
    use quote::quote;

    /// A refused fixed dim (a suffixed literal) gives its own error and no other: indexing past
    /// it once overflowed the offset's arithmetic (found by the fuzzer).
    #[test]
    fn a_refused_dim_gives_one_error_when_indexed() {
        let e = errors(quote! {
            fn f(x: [f32; n], m: [bf16; 2, 2i32]) -> [f32; n] { x - (m[1][2] as f32) }
        });
        assert_eq!(
            e,
            ["a fixed dim is a plain integer literal, such as `4`, with no suffix"]
        );
        let e = errors(quote! {
            fn f(x: [f32; n], m: [bf16; 4294967296, 4294967297]) -> [f32; n] { x - (m[4294967295][4294967296] as f32) }
        });
        assert_eq!(e, ["`m` has more elements than a 64-bit index reaches"]);
    }

    /// `w[i][j]` is the element at row-major offset `i * cols + j`, a scalar of `w`'s type, and
    /// both backends read it at that offset.
    #[test]
    fn indices_become_one_offset() {
        let k = kernel(quote! {
            fn f(x: [f32; n], w: [f32; 3], m: [bf16; 2, 3]) -> [f32; n] { x * w[0] + w[2] - (m[1][2] as f32) }
        });
        let offsets: Vec<(usize, u64)> = k
            .nodes
            .iter()
            .filter_map(|n| match n.op {
                Op::Element(p, o) => Some((p, o)),
                _ => None,
            })
            .collect();
        assert_eq!(offsets, [(1, 0), (1, 2), (2, 5)]);
        let program = crate::plan::program(&k);
        let cuda = crate::cuda::sources(&k, &program).join("\n");
        assert!(
            cuda.contains("p_w[2]") && cuda.contains("fz_bf16_to_f32(p_m[5])"),
            "{cuda}"
        );
        let cpu = crate::cpu::body(&k, &program.plan);
        assert!(
            cpu.contains("p_w[2]") && cpu.contains("to_f32(p_m[5])"),
            "{cpu}"
        );
    }

    #[test]
    fn what_cannot_be_indexed_says_what_can() {
        assert_error(
            quote! { fn f(x: [f32; n], w: [f32; 3]) -> [f32; n] { x * w[3] } },
            "index out of bounds: this dim of `w` has size 3 but the index is 3",
        );
        assert_error(
            quote! { fn f(x: [f32; n, 3]) -> [f32; n] { x[.., 0] - x[0][1] } },
            "`x` is indexed along `n`, a dim whose size is known only at launch",
        );
        assert_error(
            quote! { fn f(x: [f32; n], w: [f32; 3, 4], i: u32) -> [f32; n] { x * w[i][0] } },
            "the indices of `w[i][j]` are integer literals, as in `w[0][1]`",
        );
        assert_error(
            quote! { fn f(x: [f32; n], w: [f32; 3]) -> [f32; n] { x * w[-1] } },
            "index out of bounds: indices start at 0, and this one is -1",
        );
        assert_error(
            quote! { fn f(x: [f32; n], w: [f32; 2, 3]) -> [f32; n] { x * w[1] } },
            "`w` has 2 dims, `[2, 3]`, but is indexed by 1: index every dim to pick one element, as in `w[0][0]`",
        );
        assert_error(
            quote! { fn f(x: [f32; n], w: [f32; 3]) -> [f32; n] { x * (w * 2.0)[1] } },
            "only a tensor parameter can be indexed, as in `w[0]` with `w: [f32; 3]`, and `(w * 2.0)` is a computed value",
        );
        assert_error(
            quote! { fn f(x: [f32; n], s: f32) -> [f32; n] { x * s[0] } },
            "only a tensor parameter can be indexed",
        );
        // Derivatives go through constant indexing.
        kernel(
            quote! { #[vjp(x, w)] #[jvp(w)] fn f(x: [f32; n], w: [f32; 3]) -> [f32; n] { x * w[1] } },
        );
        // A `let` name of the parameter itself is the parameter.
        kernel(quote! { fn f(x: [f32; n], w: [f32; 3]) -> [f32; n] { let v = w; x * v[1] } });
        // Independent mistakes in one index expression are all reported.
        let e = errors(
            quote! { fn f(x: [f32; n], w: [f32; 3]) -> [f32; n] { let a = w[1.5]; x * a + x[0][0] } },
        );
        assert_eq!(e.len(), 2, "{e:?}");
    }
}
