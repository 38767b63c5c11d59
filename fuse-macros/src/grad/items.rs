//! The Rust items of a kernel's derivatives, in its module: `Grads`, `vjp`, `value_and_vjp`,
//! `Saved`, `forward_train` and `backward` for `#[vjp(..)]`, `jvp` for `#[jvp(..)]`. Each
//! function runs the launches of a [`Derived`], the hidden kernels `__<name>_<mode><i>` beside
//! them, which `expand` writes as it writes every kernel.

use super::{Derived, Dest, Train};
use crate::ir::plain_name;
use crate::rust::{elem_tokens, local, rt};
use crate::ty::Elem;
use proc_macro2::{Ident, Span, TokenStream};
use quote::{format_ident, quote};

/// What the derivative functions' signatures need: the kernel's inputs and outputs and the
/// lists of the attributes (indices into `inputs`).
pub struct ApiSig {
    pub kernel: Ident,
    pub inputs: Vec<(Ident, Elem, bool)>,
    pub outputs: Vec<Elem>,
    pub tuple: bool,
    pub vjp: Option<Vec<usize>>,
    pub jvp: Option<Vec<usize>>,
}

/// The bodies of the functions, or `None` for a kernel with errors (whose items are stubs).
pub struct Bodies<'a> {
    pub vjp: Option<&'a Derived>,
    pub value_and_vjp: Option<&'a Derived>,
    pub jvp: Option<&'a Derived>,
    pub train: Option<&'a Train>,
}

impl ApiSig {
    /// A name for each output's cotangent (as `schedule::output_names` names the derived
    /// kernels' parameters, which the calls pass these to).
    fn output_names(&self, prefix: &str) -> Vec<Ident> {
        let names =
            super::schedule::output_names(&self.names(), self.outputs.len(), self.tuple, prefix);
        names
            .iter()
            .map(|n| Ident::new(n, Span::call_site()))
            .collect()
    }

    /// `name`, clear of the inputs' names and the device argument's.
    fn clear(&self, name: String) -> String {
        super::schedule::unique(&name, &self.names())
    }

    fn names(&self) -> Vec<String> {
        self.inputs.iter().map(|(n, _, _)| plain_name(n)).collect()
    }

    fn input_params(&self, buffers: bool) -> Vec<TokenStream> {
        let rt = rt();
        self.inputs
            .iter()
            .map(|(name, e, tensor)| {
                let t = elem_tokens(*e);
                match (*tensor, buffers) {
                    (true, true) => quote!(#name: &#rt::Buffer<#t>),
                    (true, false) => quote!(#name: &impl #rt::Input<#t>),
                    (false, _) => quote!(#name: #t),
                }
            })
            .collect()
    }

    /// The cotangent parameters: a buffer for each float output.
    fn cotangent_params(&self) -> Vec<TokenStream> {
        let rt = rt();
        self.output_names("d_")
            .into_iter()
            .zip(&self.outputs)
            .filter(|(_, e)| e.is_float())
            .map(|(name, e)| {
                let t = elem_tokens(*e);
                quote!(#name: &impl #rt::Input<#t>)
            })
            .collect()
    }

    fn output_types(&self) -> Vec<TokenStream> {
        let rt = rt();
        self.outputs
            .iter()
            .map(|e| {
                let t = elem_tokens(*e);
                quote!(#rt::Buffer<#t>)
            })
            .collect()
    }
}

/// The derivative items of a kernel, for its module.
pub fn items(sig: &ApiSig, bodies: &Bodies) -> TokenStream {
    let mut out = TokenStream::new();
    if let Some(list) = &sig.vjp {
        out.extend(reverse_items(sig, list, bodies));
    }
    if let Some(list) = &sig.jvp {
        out.extend(forward_items(sig, list, bodies.jvp));
    }
    out
}

fn reverse_items(sig: &ApiSig, list: &[usize], bodies: &Bodies) -> TokenStream {
    let rt = rt();
    let dev = format_ident!("{}", crate::check::DEVICE_ARG);
    let kernel = plain_name(&sig.kernel);
    let fields: Vec<&Ident> = list.iter().map(|&i| &sig.inputs[i].0).collect();
    let field_types: Vec<TokenStream> = list
        .iter()
        .map(|&i| {
            let t = elem_tokens(sig.inputs[i].1);
            quote!(#rt::Buffer<#t>)
        })
        .collect();
    let field_docs: Vec<String> = list
        .iter()
        .map(|&i| {
            let (name, e, tensor) = &sig.inputs[i];
            match tensor {
                true => format!(
                    "The gradient of `{}`: its shape, in `{e}`.",
                    plain_name(name)
                ),
                false => format!(
                    "The gradient of the scalar `{}`: a buffer of shape `[]`, in `{e}`.",
                    plain_name(name)
                ),
            }
        })
        .collect();
    let inputs = sig.input_params(false);
    let buffer_inputs = sig.input_params(true);
    let cotangents = sig.cotangent_params();
    let input_names: Vec<&Ident> = sig.inputs.iter().map(|(n, _, _)| n).collect();
    let outs = sig.output_types();
    let launches = |d: Option<&Derived>| d.map_or(0, |d| d.steps.len());
    let vjp_body = body(bodies.vjp, &Result::Grads(fields.clone()), &[]);
    let both_body = body(
        bodies.value_and_vjp,
        &Result::Both(sig.outputs.len(), fields.clone()),
        &[],
    );
    let (n_vjp, n_both) = (launches(bodies.vjp), launches(bodies.value_and_vjp));
    let listed: Vec<String> = fields
        .iter()
        .map(|f| format!("`{}`", plain_name(f)))
        .collect();
    let listed = listed.join(", ");
    let grads_doc = format!(
        "The gradients of [`{kernel}()`](fn@super::{kernel}) with respect to {listed}: one field each, of its parameter's shape and type (a scalar's is a buffer of shape `[]`)."
    );
    let vjp_doc = format!(
        "The gradients of [`{kernel}()`](fn@super::{kernel}) with respect to {listed}, given its inputs and a cotangent for each float output (of that output's shape and type, in the outputs' order): the vector-Jacobian product, computed in f32 (f64 for f64 kernels) and returned in each parameter's type. Recomputes what it needs from the inputs. {n_vjp} launch{}; deterministic, the same bits every run.",
        if n_vjp == 1 { "" } else { "es" }
    );
    let both_doc = format!(
        "The outputs of [`{kernel}()`](fn@super::{kernel}) and [`vjp`]'s gradients at once, the outputs computed in the launches that compute the gradients where they fuse: {n_both} launch{} in all.",
        if n_both == 1 { "" } else { "es" }
    );
    let kept = bodies.train.map_or(&[][..], |t| &t.saved[..]);
    let kept_names: Vec<Ident> = (0..kept.len())
        .map(|i| Ident::new(&sig.clear(format!("__saved{i}")), Span::call_site()))
        .collect();
    let n_back = bodies.train.map_or(0, |t| t.backward.steps.len());
    let saved_doc = saved_doc(&kernel, bodies.train, n_back);
    let train_doc = format!(
        "[`{kernel}()`](fn@super::{kernel}) for training: its outputs and the [`Saved`] that [`backward`] takes, in one launch."
    );
    let backward_doc = format!(
        "The gradients from what [`forward_train`] saved and a cotangent for each float output, as [`vjp`] computes them: {n_back} launch{}, reading the saved values instead of computing them again.",
        if n_back == 1 { "" } else { "es" }
    );
    let mut saved_fields: Vec<TokenStream> = sig
        .inputs
        .iter()
        .map(|(n, e, tensor)| {
            let t = elem_tokens(*e);
            match tensor {
                true => quote!(#n: #rt::Buffer<#t>),
                false => quote!(#n: #t),
            }
        })
        .collect();
    saved_fields.extend(kept.iter().zip(&kept_names).map(|(s, n)| {
        let t = elem_tokens(if s.packed { Elem::U32 } else { s.elem });
        quote!(#n: #rt::Buffer<#t>)
    }));
    let saved_values: Vec<TokenStream> = sig
        .inputs
        .iter()
        .map(|(n, _, tensor)| match tensor {
            true => quote!(#n: #n.reshape(#n.shape())?),
            false => quote!(#n),
        })
        .collect();
    let saved = local("saved");
    let unpack: Vec<TokenStream> = sig
        .inputs
        .iter()
        .map(|(n, _, tensor)| match tensor {
            true => quote!(let #n = &#saved.#n;),
            false => quote!(let #n = #saved.#n;),
        })
        .collect();
    let bound: Vec<(usize, TokenStream)> = kept
        .iter()
        .zip(&kept_names)
        .map(|(s, n)| (s.temp, quote!(&#saved.#n)))
        .collect();
    let backward_body = body(
        bodies.train.map(|t| &t.backward),
        &Result::Grads(fields.clone()),
        &bound,
    );
    let out_vars: Vec<Ident> = (0..sig.outputs.len())
        .map(|j| local(&format!("__out{j}")))
        .collect();
    let kept_vars: Vec<Ident> = (0..kept.len())
        .map(|i| local(&format!("__saved{i}")))
        .collect();
    let forward_call = match bodies.train {
        Some(t) => {
            let f = &t.forward.name;
            let all: Vec<&Ident> = out_vars.iter().chain(&kept_vars).collect();
            let bind = match all.len() {
                1 => quote!(#(#all)*),
                _ => quote!((#(#all),*)),
            };
            quote!(let #bind = #f(#dev, #(#input_names),*)?;)
        }
        None => quote!(),
    };
    let train_body = match bodies.train {
        Some(_) => quote! {
            #forward_call
            let #saved = Saved { #(#saved_values,)* #(#kept_names: #kept_vars),* };
            ::core::result::Result::Ok((#(#out_vars,)* #saved))
        },
        None => quote!(::core::unreachable!("this `fuse!` kernel has errors")),
    };
    let (vjp_bytes, train_bytes) = bodies.train.map_or((0.0, 0.0), |t| {
        (f64::from(t.vjp_bits) / 8.0, f64::from(t.pair_bits) / 8.0)
    });
    quote! {
        /// The launches [`vjp`] makes.
        pub const VJP_LAUNCHES: usize = #n_vjp;
        /// The launches [`backward`] makes.
        pub const BACKWARD_LAUNCHES: usize = #n_back;
        /// The bytes [`vjp`]'s launches move an element of the kernel's domain: the tensors
        /// over all of it that they read and write (a row's values, of a few bytes a row, left
        /// out).
        pub const VJP_BYTES_PER_ELEMENT: f64 = #vjp_bytes;
        /// The same for the training pair beyond the forward's own outputs: what
        /// [`forward_train`] saves over all of the domain, and [`backward`]'s launches (a
        /// mask saved as packed bits moves an eighth of a byte an element each way).
        pub const TRAIN_BYTES_PER_ELEMENT: f64 = #train_bytes;
        /// The launches [`value_and_vjp`] makes.
        pub const VALUE_AND_VJP_LAUNCHES: usize = #n_both;
        #[doc = #grads_doc]
        pub struct Grads {
            #(#[doc = #field_docs] pub #fields: #field_types,)*
        }
        #[doc = #vjp_doc]
        #[allow(clippy::too_many_arguments)]
        pub fn vjp(#dev: &#rt::Device, #(#inputs,)* #(#cotangents),*) -> ::core::result::Result<Grads, #rt::Error> {
            #vjp_body
        }
        #[doc = #both_doc]
        #[allow(clippy::too_many_arguments, clippy::type_complexity)]
        pub fn value_and_vjp(#dev: &#rt::Device, #(#inputs,)* #(#cotangents),*) -> ::core::result::Result<(#(#outs,)* Grads), #rt::Error> {
            #both_body
        }
        #[doc = #saved_doc]
        pub struct Saved {
            #(#saved_fields,)*
        }
        #[doc = #train_doc]
        #[allow(clippy::too_many_arguments, clippy::type_complexity)]
        pub fn forward_train(#dev: &#rt::Device, #(#buffer_inputs),*) -> ::core::result::Result<(#(#outs,)* Saved), #rt::Error> {
            #train_body
        }
        #[doc = #backward_doc]
        #[allow(clippy::too_many_arguments)]
        pub fn backward(#dev: &#rt::Device, #saved: &Saved, #(#cotangents),*) -> ::core::result::Result<Grads, #rt::Error> {
            #(#unpack)*
            #backward_body
        }
    }
}

fn forward_items(sig: &ApiSig, list: &[usize], jvp: Option<&Derived>) -> TokenStream {
    let rt = rt();
    let dev = format_ident!("{}", crate::check::DEVICE_ARG);
    let kernel = plain_name(&sig.kernel);
    let inputs = sig.input_params(false);
    let tangents: Vec<TokenStream> = list
        .iter()
        .map(|&i| {
            let (name, e, tensor) = &sig.inputs[i];
            let name = Ident::new(
                &sig.clear(format!("t_{}", plain_name(name))),
                Span::call_site(),
            );
            let t = elem_tokens(*e);
            match tensor {
                true => quote!(#name: &impl #rt::Input<#t>),
                false => quote!(#name: #t),
            }
        })
        .collect();
    let outs = sig.output_types();
    let tangent_outs: Vec<TokenStream> = sig
        .outputs
        .iter()
        .filter(|e| e.is_float())
        .map(|e| {
            let t = elem_tokens(*e);
            quote!(#rt::Buffer<#t>)
        })
        .collect();
    let n = jvp.map_or(0, |d| d.steps.len());
    let listed: Vec<String> = list
        .iter()
        .map(|&i| format!("`{}`", plain_name(&sig.inputs[i].0)))
        .collect();
    let doc = format!(
        "[`{kernel}()`](fn@super::{kernel})'s outputs and their tangents along {}: given the inputs and a tangent for each (a buffer of its shape, a value for a scalar), returns the outputs, then the tangent of each float output (the Jacobian-vector product, computed in f32, f64 for f64 kernels). {n} launch{}.",
        listed.join(", "),
        if n == 1 { "" } else { "es" }
    );
    let count = sig.outputs.len() + tangent_outs.len();
    let body = body(jvp, &Result::Tuple(count), &[]);
    quote! {
        /// The launches [`jvp`] makes.
        pub const JVP_LAUNCHES: usize = #n;
        #[doc = #doc]
        #[allow(clippy::too_many_arguments, clippy::type_complexity)]
        pub fn jvp(#dev: &#rt::Device, #(#inputs,)* #(#tangents),*) -> ::core::result::Result<(#(#outs,)* #(#tangent_outs),*), #rt::Error> {
            #body
        }
    }
}

/// How a derived function returns its results.
enum Result<'a> {
    /// `Grads { field: result j }`.
    Grads(Vec<&'a Ident>),
    /// The first `n` results, then `Grads` of the others.
    Both(usize, Vec<&'a Ident>),
    /// A tuple of the `n` results.
    Tuple(usize),
}

/// The body of a derived function: each launch in turn, its temporaries and results bound to
/// locals, then the return value.
fn body(d: Option<&Derived>, result: &Result, bound: &[(usize, TokenStream)]) -> TokenStream {
    let Some(d) = d else {
        return quote!(::core::unreachable!("this `fuse!` kernel has errors"));
    };
    let dev = format_ident!("{}", crate::check::DEVICE_ARG);
    let var = |dest: Dest| match dest {
        Dest::Result(j) => local(&format!("__r{j}")),
        Dest::Temp(t) => local(&format!("__t{t}")),
    };
    let rt = rt();
    let mut calls = TokenStream::new();
    let mut allocated: Vec<usize> = vec![];
    for step in &d.steps {
        // A result stored in parts, allocated before the first launch that stores one: of its
        // parameter's shape, zeroed where the parts leave elements out.
        for w in &step.written {
            if allocated.contains(&w.result) {
                continue;
            }
            allocated.push(w.result);
            let v = var(Dest::Result(w.result));
            let like = &step.kernel.params[w.param].name;
            let t = elem_tokens(step.kernel.params[w.param].elem);
            let alloc = match w.covered {
                true => quote!(alloc),
                false => quote!(alloc_zeroed),
            };
            calls.extend(quote! {
                let mut #v = #rt::__private::#alloc::<#t>(#dev, #rt::__private::AnyBuffer::shape(#like))?;
            });
        }
        let written = step.written.iter().map(|w| {
            let v = var(Dest::Result(w.result));
            quote!(&mut #v)
        });
        let f = &step.kernel.name;
        let args = step.kernel.params[..d.inputs].iter().map(|p| &p.name);
        let temps = step
            .temps
            .iter()
            .map(|&t| match bound.iter().find(|(b, _)| *b == t) {
                Some((_, e)) => e.clone(),
                None => {
                    let v = var(Dest::Temp(t));
                    quote!(&#v)
                }
            });
        // The outputs it returns: all but the parts it stores.
        let outs: Vec<Ident> = step
            .dests
            .iter()
            .zip(&step.kernel.outputs)
            .filter(|(_, o)| o.place.is_none())
            .map(|(&dest, _)| var(dest))
            .collect();
        let call = quote!(#f(#dev, #(#args,)* #(#temps,)* #(#written),*)?);
        calls.extend(match outs.len() {
            0 => quote!(#call;),
            1 => quote!(let #(#outs)* = #call;),
            _ => quote!(let (#(#outs),*) = #call;),
        });
    }
    let r = |j: usize| var(Dest::Result(j));
    let value = match result {
        Result::Grads(fields) => {
            let vals = (0..fields.len()).map(r);
            quote!(Grads { #(#fields: #vals),* })
        }
        Result::Both(n, fields) => {
            let outs = (0..*n).map(r);
            let vals = (*n..*n + fields.len()).map(r);
            quote!((#(#outs,)* Grads { #(#fields: #vals),* }))
        }
        Result::Tuple(n) => {
            let vals = (0..*n).map(r);
            quote!((#(#vals),*))
        }
    };
    quote! {
        #calls
        ::core::result::Result::Ok(#value)
    }
}

/// What `Saved`'s docs say: the inputs it holds, each value saved (its size), and the bytes
/// the pair moves against `vjp`'s.
fn saved_doc(kernel: &str, train: Option<&Train>, launches: usize) -> String {
    let mut doc = format!(
        "What [`forward_train`] keeps for [`backward`]: a handle to each tensor input of [`{kernel}()`](fn@super::{kernel}) (the same memory, no copy: write into none of them before `backward`), each scalar input's value"
    );
    let Some(t) = train else {
        return doc + ".";
    };
    if t.saved.is_empty() {
        doc += ". It saves no computed value: [`backward`] computes again what it needs";
    } else {
        doc += ", and the values [`backward`] would otherwise compute again:";
        for s in &t.saved {
            let size = match (s.per_element, s.packed) {
                (true, true) => {
                    "packed bits, one an element in 32-bit words: `Buffer<u32>` of the element count / 32, rounded up".to_string()
                }
                (true, false) => format!(
                    "a `{}` an element, {} byte{}",
                    s.elem,
                    s.elem.bits() / 8,
                    if s.elem.bits() == 8 { "" } else { "s" }
                ),
                (false, _) => format!("`{}`, {} bytes a value", s.elem, s.elem.bits() / 8),
            };
            doc += &format!("\n- {} over `{}` ({size})", s.what, s.shape);
        }
        doc += "\n\n";
    }
    doc + &format!(
        "{}[`backward`] makes {launches} launch{}. Over the kernel's domain, the pair moves {} bytes an element beyond the forward's outputs, where [`vjp`] moves {} ([`TRAIN_BYTES_PER_ELEMENT`], [`VJP_BYTES_PER_ELEMENT`]).",
        if t.saved.is_empty() { ". " } else { "" },
        if launches == 1 { "" } else { "es" },
        bytes_text(t.pair_bits),
        bytes_text(t.vjp_bits),
    )
}

/// Bits as bytes, as the docs say them: `10`, `8.25`.
fn bytes_text(bits: u32) -> String {
    format!("{}", f64::from(bits) / 8.0)
}
