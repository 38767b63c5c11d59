//! The generated Rust items. For each `fn name` of the input:
//! - `fn name(dev, inputs..) -> Result<outputs, Error>`, which allocates its outputs;
//! - `mod name` with `CUDA_SOURCE`, the write-into form `into(dev, inputs.., &mut outputs..)`, the
//!   signature the runtime checks shapes against, and the CPU implementation.
//!
//! Generated code names only `::fuse_runtime::…` paths. On any error the items are still emitted,
//! with the same signatures and unreachable bodies, so that one mistake gives one error.

use crate::check::{check, DEVICE_ARG};
use crate::error::Errors;
use crate::ir::{plain_name, Dim, Kernel, Launch};
use crate::parse::KernelDef;
use crate::rust::{elem_tokens, local, rt};
use crate::ty::Elem;
use proc_macro2::{Ident, Span, TokenStream};
use quote::{format_ident, quote};

pub fn fuse(input: TokenStream) -> TokenStream {
    let input = match crate::parse::parse_input(input) {
        Ok(i) => i,
        Err(e) => return e.to_compile_error(),
    };
    let mut cx = Errors::default();
    let kernels = check(&input, &mut cx);
    match cx.propagate() {
        Ok(()) => {
            let (archs, mut out) = crate::cubin::requested_at(kernels.first().map(|k| &k.name));
            out.extend(kernels.iter().map(|k| expand_kernel(k, &archs)));
            out
        }
        Err(e) => {
            let mut out = e.to_compile_error();
            // One stub per name: rustc would report a duplicate a second time.
            let mut seen = std::collections::HashSet::new();
            out.extend(
                input
                    .kernels
                    .iter()
                    .filter(|k| seen.insert(plain_name(&k.name)))
                    .map(stub),
            );
            out
        }
    }
}

/// The Rust-facing signature of a kernel, which a stub shares with the real items.
struct RustSig {
    inputs: Vec<(Ident, Elem, bool)>,
    /// For each input, whether it is a `&mut` parameter, which the kernel writes.
    written: Vec<bool>,
    /// The returned outputs.
    outputs: Vec<Elem>,
    tuple: bool,
}

impl RustSig {
    /// The signature of a kernel that did not check, for its stub: parameter names are made
    /// distinct (and clear of the device argument) so rustc adds no error of its own.
    fn from_def(def: &KernelDef) -> RustSig {
        let mut seen = std::collections::HashSet::new();
        seen.insert(DEVICE_ARG.to_string());
        let inputs = def
            .params
            .iter()
            .map(|p| {
                let mut name = plain_name(&p.name);
                let mut ident = p.name.clone();
                while !seen.insert(name.clone()) {
                    // A suffixed name is no keyword, so it needs no `r#` (which it may have had).
                    name.push('_');
                    ident = Ident::new(&name, p.name.span());
                }
                (
                    ident,
                    p.ty.elem.resolve().unwrap_or(Elem::F32),
                    p.ty.dims.is_some(),
                )
            })
            .collect();
        let outputs = def
            .output
            .types
            .iter()
            .map(|t| t.elem.resolve().unwrap_or(Elem::F32))
            .collect();
        let written = def
            .params
            .iter()
            .map(|p| p.written.is_some() && p.ty.dims.is_some())
            .collect();
        RustSig {
            inputs,
            written,
            outputs,
            tuple: def.output.tuple,
        }
    }

    fn from_kernel(k: &Kernel) -> RustSig {
        let inputs = k
            .params
            .iter()
            .map(|p| (p.name.clone(), p.stored_elem(), p.shape.is_some()))
            .collect();
        RustSig {
            inputs,
            written: k.params.iter().map(|p| p.written).collect(),
            outputs: k
                .outputs
                .iter()
                .filter(|o| o.place.is_none())
                .map(|o| o.stored_elem())
                .collect(),
            tuple: k.tuple,
        }
    }

    fn input_params(&self) -> TokenStream {
        let rt = rt();
        self.inputs
            .iter()
            .zip(&self.written)
            .map(|((name, e, tensor), written)| {
                let t = elem_tokens(*e);
                match (*tensor, *written) {
                    (true, true) => quote!(#name: &mut impl #rt::Output<#t>,),
                    (true, false) => quote!(#name: &impl #rt::Input<#t>,),
                    (false, _) => quote!(#name: #t,),
                }
            })
            .collect()
    }

    fn output_names(&self) -> Vec<Ident> {
        (0..self.outputs.len())
            .map(|j| {
                let mut name = if self.tuple {
                    format!("out{j}")
                } else {
                    "out".to_string()
                };
                while self.inputs.iter().any(|(n, _, _)| plain_name(n) == name)
                    || name == DEVICE_ARG
                {
                    name.push('_');
                }
                Ident::new(&name, Span::call_site())
            })
            .collect()
    }

    fn output_params(&self) -> TokenStream {
        let rt = rt();
        self.output_names()
            .iter()
            .zip(&self.outputs)
            .map(|(name, e)| {
                let t = elem_tokens(*e);
                quote!(#name: &mut impl #rt::Output<#t>,)
            })
            .collect()
    }

    fn return_type(&self) -> TokenStream {
        let rt = rt();
        let types: Vec<TokenStream> = self
            .outputs
            .iter()
            .map(|e| {
                let t = elem_tokens(*e);
                quote!(#rt::Buffer<#t>)
            })
            .collect();
        if self.tuple || types.is_empty() {
            quote!((#(#types),*))
        } else {
            quote!(#(#types)*)
        }
    }

    fn input_names(&self) -> Vec<&Ident> {
        self.inputs.iter().map(|(n, _, _)| n).collect()
    }
}

fn stub(def: &KernelDef) -> TokenStream {
    let sig = RustSig::from_def(def);
    let (vis, name, attrs) = (&def.vis, &def.name, &def.attrs);
    let rt = rt();
    let dev = format_ident!("{}", DEVICE_ARG);
    let (inputs, outputs, ret) = (sig.input_params(), sig.output_params(), sig.return_type());
    let unreachable = quote!(::core::unreachable!("this `fuse!` kernel has errors"));
    let derived = derived_stubs(def, &sig);
    quote! {
        #(#attrs)*
        #[allow(unused_variables, clippy::all)]
        #vis fn #name(#dev: &#rt::Device, #inputs) -> ::core::result::Result<#ret, #rt::Error> { #unreachable }
        #[allow(unused_variables, clippy::all)]
        #vis mod #name {
            pub const CUDA_SOURCE: &str = "";
            pub fn into(#dev: &#rt::Device, #inputs #outputs) -> ::core::result::Result<(), #rt::Error> { #unreachable }
            pub fn load(#dev: &#rt::Device) -> ::core::result::Result<(), #rt::Error> { #unreachable }
            #derived
        }
    }
}

/// The derivative functions of a kernel with errors, with unreachable bodies: calls of them
/// add no error of their own. Of each attribute's names, those of parameters.
fn derived_stubs(def: &KernelDef, sig: &RustSig) -> TokenStream {
    let list = |reverse: bool| {
        def.derive.iter().find(|a| a.reverse == reverse).map(|a| {
            let mut found: Vec<usize> = vec![];
            for n in &a.names {
                let at = sig
                    .inputs
                    .iter()
                    .position(|(p, _, _)| plain_name(p) == plain_name(n));
                if let Some(i) = at.filter(|i| !found.contains(i)) {
                    found.push(i);
                }
            }
            found
        })
    };
    let api = crate::grad::items::ApiSig {
        kernel: def.name.clone(),
        inputs: sig.inputs.clone(),
        outputs: sig.outputs.clone(),
        tuple: sig.tuple,
        vjp: list(true),
        jvp: list(false),
    };
    let bodies = crate::grad::items::Bodies {
        vjp: None,
        value_and_vjp: None,
        jvp: None,
        train: None,
    };
    crate::grad::items::items(&api, &bodies)
}

/// The items of kernel `k`, with its CUBIN for each of `archs` (see [`crate::cubin`]).
fn expand_kernel(k: &Kernel, archs: &[u32]) -> TokenStream {
    let program = crate::plan::program(k);
    let sources = crate::cuda::sources(k, &program);
    // One CUBIN list per entry; of NVRTC's errors, the first (every entry fails alike).
    let (cubins, errors): (Vec<TokenStream>, Vec<TokenStream>) = sources
        .iter()
        .map(|source| crate::cubin::embed(&k.name, source, archs))
        .unzip();
    let cubin_error = errors.into_iter().find(|e| !e.is_empty());
    let sig = RustSig::from_kernel(k);
    let rt = rt();
    let (vis, name, attrs) = (&k.vis, &k.name, &k.attrs);
    let dev = format_ident!("{}", DEVICE_ARG);
    let dims = local("dims");
    let (inputs, ret) = (sig.input_params(), sig.return_type());
    let input_names = sig.input_names();
    let out_names = sig.output_names();
    let n_inputs = k.tensor_params().count();
    let tensor_inputs: Vec<&Ident> = k.tensor_params().map(|(_, p, _)| &p.name).collect();
    let alloc = out_names.iter().zip(&k.outputs).enumerate().map(|(j, (o, out))| {
        let t = elem_tokens(out.stored_elem());
        let index = n_inputs + j;
        // Packed bits are ORed into zeros.
        let alloc = match out.packed {
            true => format_ident!("alloc_zeroed"),
            false => format_ident!("alloc"),
        };
        quote! {
            let mut #o = #rt::__private::#alloc::<#t>(#dev, &#rt::__private::shape_of(&#name::__fuse::SIGNATURE, #index, &#dims))?;
        }
    });
    let result = if k.tuple || out_names.is_empty() {
        quote!((#(#out_names),*))
    } else {
        quote!(#(#out_names)*)
    };
    // Outputs are allocated at the sizes the inputs bind; a kernel that only writes through
    // `&mut` parameters allocates nothing.
    let written: Vec<&Ident> = k.written_params().map(|p| &p.name).collect();
    let bind = match (out_names.is_empty(), written.is_empty()) {
        (true, _) => TokenStream::new(),
        (false, true) => quote! {
            let #dims = #rt::__private::bind(&#name::__fuse::SIGNATURE, #dev, &[#(#tensor_inputs as &dyn #rt::__private::AnyBuffer),*])?;
        },
        (false, false) => quote! {
            let #dims = #rt::__private::bind_written(&#name::__fuse::SIGNATURE, #dev, &[#(#tensor_inputs as &dyn #rt::__private::AnyBuffer),*], &[#(&*#written as &dyn #rt::__private::AnyBuffer),*])?;
        },
    };
    let doc = fn_doc(k);
    let mod_doc = format!(
        "Items of the fused kernel [`{}()`](fn@{}): its CUDA C text and its write-into form.",
        plain_name(name),
        plain_name(name)
    );
    let module = module_items(k, &program, &sig, &sources, &cubins);
    let derived = derived_items(k, archs);
    quote! {
        #cubin_error
        #(#attrs)*
        #[doc = #doc]
        #[allow(clippy::too_many_arguments)]
        #vis fn #name(#dev: &#rt::Device, #inputs) -> ::core::result::Result<#ret, #rt::Error> {
            #bind
            #(#alloc)*
            #name::into(#dev, #(#input_names,)* #(&mut #out_names),*)?;
            ::core::result::Result::Ok(#result)
        }
        #[doc = #mod_doc]
        #vis mod #name {
            #module
            #derived
        }
    }
}

/// The derivatives of `k` (`#[vjp]`, `#[jvp]`): their hidden launches' kernels and the
/// functions that run them, for `k`'s module.
fn derived_items(k: &Kernel, archs: &[u32]) -> TokenStream {
    if k.vjp.is_none() && k.jvp.is_none() {
        return TokenStream::new();
    }
    let derive = |d: Result<crate::grad::Derived, String>| match d {
        Ok(d) => Ok(d),
        Err(message) => Err(syn::Error::new(k.name.span(), message).to_compile_error()),
    };
    let vjp = k
        .vjp
        .as_ref()
        .map(|_| derive(crate::grad::vjp(k, false, "d")));
    let both = k
        .vjp
        .as_ref()
        .map(|_| derive(crate::grad::vjp(k, true, "v")));
    let jvp = k.jvp.as_ref().map(|_| derive(crate::grad::jvp(k, "j")));
    let mut out = TokenStream::new();
    let mut ok = |d: Option<Result<crate::grad::Derived, TokenStream>>| match d {
        Some(Ok(d)) => Some(d),
        Some(Err(e)) => {
            out.extend(e);
            None
        }
        None => None,
    };
    let (vjp, both, jvp) = (ok(vjp), ok(both), ok(jvp));
    let train = match vjp.as_ref().map(|d| crate::grad::train(k, d)) {
        Some(Ok(t)) => Some(t),
        Some(Err(message)) => {
            out.extend(syn::Error::new(k.name.span(), message).to_compile_error());
            None
        }
        None => None,
    };
    let backward = train.as_ref().map(|t| &t.backward);
    for d in [vjp.as_ref(), both.as_ref(), jvp.as_ref(), backward]
        .into_iter()
        .flatten()
    {
        for step in &d.steps {
            out.extend(expand_kernel(&step.kernel, archs));
        }
    }
    if let Some(t) = &train {
        out.extend(expand_kernel(&t.forward, archs));
    }
    let sig = RustSig::from_kernel(k);
    let api = crate::grad::items::ApiSig {
        kernel: k.name.clone(),
        inputs: sig.inputs,
        outputs: sig.outputs,
        tuple: k.tuple,
        vjp: k.vjp.clone(),
        jvp: k.jvp.clone(),
    };
    let bodies = crate::grad::items::Bodies {
        vjp: vjp.as_ref(),
        value_and_vjp: both.as_ref(),
        jvp: jvp.as_ref(),
        train: train.as_ref(),
    };
    out.extend(crate::grad::items::items(&api, &bodies));
    out
}

fn fn_doc(k: &Kernel) -> String {
    let params: Vec<String> = k
        .params
        .iter()
        .map(|p| match (&p.shape, p.written) {
            (Some(s), true) => format!(
                "`{}: &mut {}`",
                plain_name(&p.name),
                type_text(k, p.elem, s)
            ),
            (Some(s), false) if p.packed => {
                format!("`{}: {}`", plain_name(&p.name), words_text(k, s))
            }
            (Some(s), false) => format!("`{}: {}`", plain_name(&p.name), type_text(k, p.elem, s)),
            (None, _) => format!("`{}: {}`", plain_name(&p.name), p.elem),
        })
        .collect();
    // The returned outputs: a write through `&mut` stores into its parameter instead.
    let outputs: Vec<String> = k
        .outputs
        .iter()
        .filter(|o| o.place.is_none())
        .map(|o| match o.packed {
            true => format!("`{}`", words_text(k, &o.shape)),
            false => format!("`{}`", type_text(k, o.stored_elem(), &o.stored_shape())),
        })
        .collect();
    format!(
        "\n\nFused kernel, one launch ({}). Takes {}; returns {}. \
         Shapes are checked against the declared dims at the call. `{}::into` writes into \
         preallocated outputs; `{}::CUDA_SOURCE` is the generated CUDA C.",
        launch_text(k),
        if params.is_empty() {
            "nothing".to_string()
        } else {
            params.join(", ")
        },
        match outputs.is_empty() {
            true => "nothing, writing its `&mut` parameters".to_string(),
            false => format!("{}, allocated on `dev`", outputs.join(", ")),
        },
        plain_name(&k.name),
        plain_name(&k.name),
    )
}

fn type_text(k: &Kernel, e: Elem, shape: &[usize]) -> String {
    if shape.is_empty() {
        return e.to_string();
    }
    format!("[{e}; {}]", declared_text(k, shape))
}

/// A shape's dims as the signature declares them (a merged dim as its parts), `rows, cols`.
fn declared_text(k: &Kernel, shape: &[usize]) -> String {
    let dims: Vec<String> = k
        .declared(shape)
        .iter()
        .map(|&d| k.dims[d].to_string())
        .collect();
    dims.join(", ")
}

/// Packed bits' type: `[u32; words of [rows, cols]]`.
fn words_text(k: &Kernel, shape: &[usize]) -> String {
    format!(
        "[u32; words of [{}]] (packed bits)",
        declared_text(k, shape)
    )
}

fn launch_text(k: &Kernel) -> String {
    match &k.launch {
        Launch::Map { .. } => "elementwise".into(),
        Launch::Rows { axis, .. } => {
            format!("reducing over `{}` row by row", k.dims[*axis].text(&k.dims))
        }
        Launch::Full { .. } => "reducing over every element".into(),
    }
}

fn signature(k: &Kernel, sig: &RustSig) -> TokenStream {
    let rt = rt();
    let dims: Vec<&str> = k.named_dims().map(|(_, n)| n).collect();
    let dim_refs =
        |shape: &[usize]| -> Vec<TokenStream> { shape.iter().map(|&d| dim_ref(k, d)).collect() };
    let inputs = k
        .tensor_params()
        .map(|(_, p, s)| (plain_name(&p.name), s.clone(), false, p.packed));
    let outputs = sig
        .output_names()
        .into_iter()
        .zip(&k.outputs)
        .map(|(n, o)| (plain_name(&n), o.stored_shape(), true, o.packed));
    // Then the `&mut` parameters, in the order of [`Kernel::output_buffer`].
    let written = k.written_params().map(|p| {
        (
            plain_name(&p.name),
            p.shape.clone().unwrap_or_default(),
            true,
            false,
        )
    });
    let tensors = inputs
        .chain(outputs)
        .chain(written)
        .map(|(name, shape, output, packed)| {
            let mut refs = dim_refs(&k.declared(&shape));
            if packed {
                refs = vec![quote!(#rt::__private::DimRef::Words(&[#(#refs),*]))];
            }
            quote!(#rt::__private::TensorSig { name: #name, dims: &[#(#refs),*], output: #output })
        });
    let kernel = plain_name(&k.name);
    quote! {
        #[doc(hidden)]
        pub static SIGNATURE: #rt::__private::Signature = #rt::__private::Signature {
            kernel: #kernel,
            dims: &[#(#dims),*],
            tensors: &[#(#tensors),*],
        };
    }
}

/// A dim as the runtime's `DimRef`: an index into the named dims, a fixed size, or a sum of
/// them.
fn dim_ref(k: &Kernel, d: usize) -> TokenStream {
    let rt = rt();
    match (&k.dims[d], k.named_index(d)) {
        (_, Some(i)) => quote!(#rt::__private::DimRef::Named(#i)),
        (Dim::Fixed(v), None) => {
            let v = *v as usize;
            quote!(#rt::__private::DimRef::Fixed(#v))
        }
        // `2 * h + p`, `d * 2`: the sum of its terms' sizes, which the call checks or binds.
        (Dim::Composite(c), None) => {
            let terms = c.terms().into_iter().map(|(count, d)| {
                let count = count as usize;
                let d = dim_ref(k, d);
                quote!((#count, #d))
            });
            quote!(#rt::__private::DimRef::Sum(&[#(#terms),*]))
        }
        // Dims reduced together: the product of their sizes.
        (Dim::Merged(parts), None) => {
            let parts = parts.iter().map(|&d| dim_ref(k, d));
            quote!(#rt::__private::DimRef::Product(&[#(#parts),*]))
        }
        (Dim::Named(_), None) => unreachable!("a named dim has an index"),
    }
}

/// The runtime's `Program` of `program`: the parameters, the work, and an entry per path, each
/// naming its `KernelInfo` (`ENTRY_<i>`, beside the `KernelInfo` literals submitted to
/// `inventory`).
fn program_items(
    k: &Kernel,
    program: &crate::plan::Program,
    sources: &[String],
    cubins: &[TokenStream],
) -> TokenStream {
    use crate::plan::{Grid, Param};
    let rt = rt();
    let p = quote!(#rt::__private);
    let kernel = plain_name(&k.name);
    let tensor_index = |i: usize| {
        k.tensor_params()
            .position(|(j, _, _)| j == i)
            .expect("a tensor")
    };
    let scalar_index = |i: usize| k.params[..i].iter().filter(|p| p.shape.is_none()).count();
    let n_inputs = k.tensor_params().count();
    let params = program.params.iter().map(|param| match *param {
        Param::Input(i) => {
            let (tensor, bytes) = (tensor_index(i), k.params[i].stored_elem().bits() / 8);
            quote!(#p::Param::Input { tensor: #tensor, bytes: #bytes })
        }
        Param::Output(j) => {
            let tensor = n_inputs + k.output_buffer(j);
            let bytes = k.outputs[j].stored_elem().bits() / 8;
            quote!(#p::Param::Output { tensor: #tensor, bytes: #bytes })
        }
        Param::Scalar(i) => {
            let i = scalar_index(i);
            quote!(#p::Param::Scalar(#i))
        }
        Param::Dim(i) => quote!(#p::Param::Dim(#i)),
        Param::Reciprocal(j) => {
            let divisor = &program.divisors[j];
            let dims = divisor.dims.iter().map(|&d| dim_ref(k, d));
            let by = divisor.by;
            quote!(#p::Param::Reciprocal { dims: &[#(#dims),*], by: #by })
        }
        Param::RoundKey { seed, round } => {
            let seed = scalar_index(program.seeds[seed]);
            quote!(#p::Param::RoundKey { seed: #seed, round: #round })
        }
        Param::Scratch => quote!(#p::Param::Scratch),
        Param::Counter => quote!(#p::Param::Counter),
    });
    let work = match &k.launch {
        Launch::Map { domain } | Launch::Full { domain } => {
            let dims = domain.iter().map(|&d| dim_ref(k, d));
            quote!(#p::Work::Elements(&[#(#dims),*]))
        }
        Launch::Rows { domain, axis } => {
            let rows = domain.iter().filter(|&d| d != axis).map(|&d| dim_ref(k, d));
            let len = dim_ref(k, *axis);
            quote!(#p::Work::Rows { rows: &[#(#rows),*], len: #len })
        }
    };
    let mut statics = TokenStream::new();
    let mut entries = vec![];
    for (i, ((entry, source), cubins)) in
        program.entries.iter().zip(sources).zip(cubins).enumerate()
    {
        let (info, cubin) = (format_ident!("ENTRY_{}", i), format_ident!("CUBINS_{}", i));
        let symbol = &entry.symbol;
        let source = if i + 1 == program.entries.len() {
            quote!(super::CUDA_SOURCE)
        } else {
            quote!(#source)
        };
        let doc = format!("The entry point of path `{}`.", entry.label());
        statics.extend(quote! {
            const #cubin: &[(u32, &[u8])] = #cubins;
            #[doc = #doc]
            pub static #info: #p::KernelInfo = #p::KernelInfo { name: #kernel, symbol: #symbol, source: #source, cubins: #cubin };
        });

        let w = entry.when;
        let (min_len, max_len, multiple_of, min_arch, long_rows, inner_multiple_of) = (
            w.min_len,
            w.max_len,
            w.multiple_of,
            w.min_arch,
            w.long_rows,
            w.inner_multiple_of,
        );
        let grid = match entry.grid {
            Grid::Map { vectors } => quote!(#p::Grid::Map { vectors: #vectors }),
            Grid::Rows { blocks_per_sm } => {
                quote!(#p::Grid::Rows { blocks_per_sm: #blocks_per_sm })
            }
            Grid::Parts {
                blocks_per_sm,
                sums,
            } => quote!(#p::Grid::Parts { blocks_per_sm: #blocks_per_sm, sums: #sums }),
            Grid::Chunks {
                blocks_per_sm,
                sums,
            } => quote!(#p::Grid::Chunks { blocks_per_sm: #blocks_per_sm, sums: #sums }),
            Grid::LongRows { cache_bytes, sums } => {
                quote!(#p::Grid::LongRows { cache_bytes: #cache_bytes, sums: #sums })
            }
            Grid::Full { slots } => quote!(#p::Grid::Full { slots: #slots }),
            Grid::Columns {
                slots,
                split,
                blocks_per_sm,
                width,
            } => quote!(#p::Grid::Columns {
                slots: #slots,
                split: #split,
                blocks_per_sm: #blocks_per_sm,
                width: #width
            }),
        };
        let path = entry.label();
        entries.push(quote! {
            #p::Entry {
                kernel: &#info,
                path: #path,
                when: #p::When { min_len: #min_len, max_len: #max_len, multiple_of: #multiple_of, min_arch: #min_arch, long_rows: #long_rows, inner_multiple_of: #inner_multiple_of },
                grid: #grid,
            }
        });
    }
    quote! {
        #statics
        /// The kernel's schedule: its entry points, their arguments, and the rule that picks one.
        pub static PROGRAM: #p::Program = #p::Program {
            signature: &SIGNATURE,
            params: &[#(#params),*],
            work: #work,
            entries: &[#(#entries),*],
        };
        #p::inventory::submit! { #p::Registered(&PROGRAM) }
        // `fuse_runtime::kernels()` lists the `fn` once, by its general entry, the last.
        #p::inventory::submit! { #p::Family(&super::ENTRIES) }
    }
}

fn module_items(
    k: &Kernel,
    program: &crate::plan::Program,
    sig: &RustSig,
    sources: &[String],
    cubins: &[TokenStream],
) -> TokenStream {
    let rt = rt();
    let dev = format_ident!("{}", DEVICE_ARG);
    let (inputs, outputs) = (sig.input_params(), sig.output_params());
    let kernel = plain_name(&k.name);
    let signature = signature(k, sig);
    let out_names = sig.output_names();
    let tensor_inputs: Vec<&Ident> = k.tensor_params().map(|(_, p, _)| &p.name).collect();
    let scalars: Vec<&Ident> = k
        .params
        .iter()
        .filter(|p| p.shape.is_none())
        .map(|p| &p.name)
        .collect();
    // Every buffer written: the returned outputs, then the `&mut` parameters.
    let written: Vec<&Ident> = k.written_params().map(|p| &p.name).collect();
    let out_names: Vec<&Ident> = out_names.iter().chain(written).collect();
    let dims = local("dims");
    let tensors = local("tensors");
    let general = sources.last().expect("every program has an entry");
    let program_items = program_items(k, program, sources, cubins);
    let n_entries = program.entries.len();
    let entry_infos = (0..n_entries).map(|i| format_ident!("ENTRY_{}", i));
    let cpu = cpu_items(k, &program.plan, sig);
    let into_doc = format!("Runs [`{kernel}()`](fn@super::{kernel}) into preallocated outputs, for loops that must not allocate (and CUDA graph captures).");
    let load_doc = format!("Loads every entry point of [`{kernel}()`](fn@super::{kernel}) on `dev` now, as the first call that takes each would, and readies the stream's reduction scratch: call it before capturing a CUDA graph that uses the kernel. Does nothing on the CPU.");
    let source_doc = format!(
        "The CUDA C text of this kernel's general entry point, which takes every shape; \
         `ENTRIES` lists every entry point ({n_entries} here), each with its own text, compiled \
         by NVRTC on its first use on a device."
    );
    quote! {
        #[doc = #source_doc]
        pub const CUDA_SOURCE: &str = #general;
        /// Every entry point of this kernel, one per path, in the order the launch tries them;
        /// the last is `CUDA_SOURCE`'s.
        pub static ENTRIES: [&#rt::KernelInfo; #n_entries] = [#(&self::__fuse::#entry_infos),*];
        /// What the runtime needs of this kernel; in a module of its own so that no parameter
        /// name can shadow it.
        #[doc(hidden)]
        pub mod __fuse {
            #program_items
            #signature
        }
        #[doc = #into_doc]
        #[allow(clippy::too_many_arguments)]
        pub fn into(#dev: &#rt::Device, #inputs #outputs) -> ::core::result::Result<(), #rt::Error> {
            let #tensors = [#(#tensor_inputs as &dyn #rt::__private::AnyBuffer,)* #(&*#out_names as &dyn #rt::__private::AnyBuffer),*];
            let #dims = #rt::__private::bind(&self::__fuse::SIGNATURE, #dev, &#tensors)?;
            if #rt::__private::is_cpu(#dev) {
                return self::cpu(&#dims, #(#tensor_inputs,)* #(#scalars,)* #(#out_names),*);
            }
            #rt::__private::launch_program(#dev, &self::__fuse::PROGRAM, &#dims, &#tensors, &[#(#rt::Element::to_bits(#scalars)),*])
        }
        #[doc = #load_doc]
        pub fn load(#dev: &#rt::Device) -> ::core::result::Result<(), #rt::Error> {
            for entry in &ENTRIES {
                #dev.load(entry)?;
            }
            ::core::result::Result::Ok(())
        }
        #cpu
    }
}

fn cpu_items(k: &Kernel, plan: &crate::plan::Plan, sig: &RustSig) -> TokenStream {
    let rt = rt();
    // Every buffer written (see [`Kernel::output_buffer`]): the returned outputs, then the
    // `&mut` parameters.
    let returned = sig.output_names();
    let written = k.written_params();
    let out_names: Vec<Ident> = returned
        .iter()
        .cloned()
        .chain(k.written_params().map(|p| p.name.clone()))
        .collect();
    let tensors: Vec<(&Ident, TokenStream)> = k
        .tensor_params()
        .map(|(_, p, _)| (&p.name, elem_tokens(p.stored_elem())))
        .collect();
    let scalars: Vec<(&Ident, TokenStream)> = k
        .params
        .iter()
        .filter(|p| p.shape.is_none())
        .map(|p| (&p.name, elem_tokens(p.elem)))
        .collect();
    let outs: Vec<TokenStream> = k
        .outputs
        .iter()
        .filter(|o| o.place.is_none())
        .map(|o| o.stored_elem())
        .chain(written.map(|p| p.elem))
        .map(elem_tokens)
        .collect();
    let (t_names, t_types): (Vec<_>, Vec<_>) = tensors.iter().cloned().unzip();
    let (s_names, s_types): (Vec<_>, Vec<_>) = scalars.iter().cloned().unzip();
    // Host copies in `cpu`; the parameter names of `compute`, which the CPU backend's body uses.
    let h_t: Vec<Ident> = (0..t_names.len())
        .map(|i| local(&format!("__t{i}")))
        .collect();
    let h_o: Vec<Ident> = (0..outs.len()).map(|j| local(&format!("__o{j}"))).collect();
    let dims = local("dims");
    let p_t: Vec<Ident> = t_names
        .iter()
        .map(|n| format_ident!("p_{}", plain_name(n)))
        .collect();
    let p_s: Vec<Ident> = s_names
        .iter()
        .map(|n| format_ident!("p_{}", plain_name(n)))
        .collect();
    let out_idents: Vec<Ident> = (0..outs.len()).map(|j| format_ident!("out{}", j)).collect();
    let dim_lets = k.named_dims().enumerate().map(|(i, (_, n))| {
        let d = format_ident!("d_{}", n);
        let dims = local("dims");
        quote!(let #d: usize = #dims[#i];)
    });
    let body: TokenStream = crate::cpu::body(k, plan)
        .parse()
        .expect("the CPU backend writes valid Rust");
    quote! {
        #[allow(clippy::too_many_arguments)]
        fn cpu(
            #dims: &[usize],
            #(#t_names: &dyn #rt::Input<#t_types>,)*
            #(#s_names: #s_types,)*
            #(#out_names: &mut dyn #rt::Output<#outs>,)*
        ) -> ::core::result::Result<(), #rt::Error> {
            #(let #h_t = #rt::__private::host_read(#t_names)?;)*
            #(let mut #h_o = #rt::__private::host_read(&*#out_names)?;)*
            self::compute(#dims, #(&#h_t,)* #(#s_names,)* #(&mut #h_o),*);
            #(#rt::__private::host_write(#out_names, #h_o)?;)*
            ::core::result::Result::Ok(())
        }
        #[allow(unused, clippy::all, clippy::pedantic)]
        fn compute(#dims: &[usize], #(#p_t: &[#t_types],)* #(#p_s: #s_types,)* #(#out_idents: &mut [#outs]),*) {
            #(#dim_lets)*
            #body
        }
    }
}
