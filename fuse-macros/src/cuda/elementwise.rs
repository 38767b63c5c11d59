//! Elementwise loops: a vector loop over groups of lanes where every tensor lines up with them,
//! then a scalar loop with coordinates for the rest.

use super::{Cuda, Scope, SYNTAX};
use crate::ir::{DimId, Launch, NodeId, Op};
use crate::plan::rows::{Pitch, Run};
use crate::plan::{Pass, Plan};
use std::collections::BTreeSet;
use std::fmt::Write;

impl Cuda<'_> {
    pub(super) fn map_body(&mut self, domain: &[DimId], plan: &Plan) {
        self.line(format!(
            "const long long n = {};",
            self.layout.product(domain)
        ));
        self.values(&plan.prologue, Scope::Row);
        for pass in &plan.passes {
            self.element_loop(
                domain,
                pass,
                "(long long)blockIdx.x * blockDim.x + threadIdx.x",
                "(long long)gridDim.x * blockDim.x",
            );
        }
    }

    /// A grid-stride (or block-stride) loop over the linear index `i` of `domain`: a vector loop
    /// over groups of `lanes` elements where every tensor lines up with them, then a scalar loop
    /// for the rest (the tail, or everything when they do not line up).
    pub(super) fn element_loop(&mut self, domain: &[DimId], pass: &Pass, start: &str, step: &str) {
        let layout = crate::plan::rows::pass_layout(self.k, pass, domain);
        let shapes = self.layout.shapes();
        let mut first = start.to_string();
        let mut tail_rolled = false;
        let mut divided = false;
        if let Some(runs) = layout.vectors() {
            // Broadcast tensors line up with the vectors when their runs are whole vectors.
            let mut aligned: Vec<String> = runs
                .iter()
                .filter_map(|(_, r)| r.repeat(domain))
                .map(|dims| {
                    format!(
                        "{} % {} == 0",
                        wrapped(&self.layout.product(dims)),
                        self.lanes
                    )
                })
                .collect();
            aligned.extend(self.slices_aligned(domain, &layout.views));
            self.slices = layout
                .views
                .iter()
                .filter_map(|(id, p)| Some((*id, p.clone()?)))
                .collect();
            if layout.by_address() {
                let views = crate::plan::rows::unpitched(&layout.views);
                aligned.extend(self.addresses_aligned(pass, domain, &views));
                let uniform = layout.addressed.clone().unwrap_or_default();
                self.addressed = Some((views, uniform));
                // The coordinates of each vector's first element, by the scalar loop's divisors.
                self.divisors(domain);
                divided = true;
            }
            // Runs, slices and accesses may test one dim or stride: each test once.
            let mut unique = vec![];
            for a in aligned {
                if !unique.contains(&a) {
                    unique.push(a);
                }
            }
            let aligned = unique;
            self.line("long long i0 = 0;");
            if !aligned.is_empty() {
                self.open(format!("if ({})", aligned.join(" && ")));
            }
            self.vector_loop(pass, start, step, domain, runs);
            self.slices.clear();
            self.addressed = None;
            self.line(format!("i0 = nv * {};", self.lanes));
            if !aligned.is_empty() {
                self.close();
            }
            first = format!("i0 + {start}");
            // The tail runs at most once a thread. Unrolled, ptxas (sm_80) spilled around it
            // in a kernel reading `u16` (`u16s::casts` of the tests); elsewhere it is left to
            // ptxas, since rolled it spilled in kernels of 8-byte inputs (`i64s::compare`).
            tail_rolled = self
                .k
                .tensor_params()
                .any(|(_, p, _)| p.elem.is_int() && p.elem.bits() < 32);
        }
        let coordinates = layout.coordinates();
        if coordinates && !divided {
            self.divisors(domain);
        }
        if tail_rolled {
            self.line("#pragma unroll 1");
        }
        self.open(format!("for (long long i = {first}; i < n; i += {step})"));
        if coordinates {
            for l in self.layout.split("i", domain, &SYNTAX) {
                self.line(l);
            }
        }
        for &s in &layout.used {
            let offset = if shapes[s] == domain {
                "i".to_string()
            } else {
                self.layout.offset(&shapes[s], None)
            };
            self.line(format!("const long long o{s} = {offset};"));
        }
        self.values(&pass.elems, Scope::Element);
        self.accumulate(&pass.reduces);
        self.writes(&pass.writes, Scope::Element);
        self.close();
    }

    /// The main part of an elementwise loop whose tensors all have the domain's shape: each step
    /// loads and stores `lanes` consecutive elements of every tensor as one aligned vector (16 bytes
    /// for 4-byte types), then computes the lanes in order. Buffers come from `cudaMalloc`, and a
    /// reshape never offsets them, so every tensor is aligned; the caller's loop does the tail.
    fn vector_loop(
        &mut self,
        pass: &Pass,
        start: &str,
        step: &str,
        domain: &[DimId],
        runs: &[(usize, Run)],
    ) {
        self.helpers.insert("fz_vec");
        let lanes = self.lanes;
        self.line(format!("const long long nv = n / {lanes};"));
        let rows = self.slices.iter().any(|(_, p)| p.pitch.is_some()) || self.addressed.is_some();
        let broadcast = runs.iter().any(|(_, run)| run.repeat(domain).is_some()) || rows;
        // A loop that draws random numbers comes twice: with 32-bit indices where they fit, and
        // with 64-bit ones for the largest tensors (see `draws_random`).
        let narrow = self.draws_random(pass);
        if broadcast || narrow {
            // Each vector's index, one step past the last, and the size of each run it is
            // divided by, fit in 32 bits.
            self.line(format!("const long long js = {step};"));
            self.line("const bool small = nv + js <= 0xffffffffll;");
        }
        for (s, run) in runs {
            if let Some(dims) = run.repeat(domain) {
                let divisor = self.divisor(dims, lanes);
                self.line(format!("const fz_divisor vr{s} = {divisor};"));
            }
            if let Some(dims) = run.skipped(domain) {
                let divisor = self.divisor(dims, 1);
                self.line(format!("const fz_divisor vm{s} = {divisor};"));
            }
        }
        if rows {
            let divisor = self.divisor(&domain[domain.len() - 1..], lanes);
            self.line(format!("const fz_divisor vw = {divisor};"));
        }
        let step = if broadcast || narrow { "js" } else { step };
        if narrow {
            self.open("if (small)");
            self.vector_steps(pass, start, step, domain, runs, "unsigned int");
            self.close();
            self.open("else");
            self.vector_steps(pass, start, step, domain, runs, "long long");
            self.close();
        } else {
            self.vector_steps(pass, start, step, domain, runs, "long long");
        }
    }

    /// Whether an elementwise kernel's vector loop draws random numbers, and so is bound by its
    /// instructions (Philox's 40 a vector), of which its 64-bit index arithmetic was a good part.
    /// In W3 (bias, GELU and dropout) the loop took 207 instructions a vector with 64-bit indices
    /// (the loop, the addresses, the bias's column, Philox's counter) and 175 with 32-bit ones
    /// (NOTES item 61). Kernels that only broadcast are bound by memory; a second loop would
    /// only cost them compile time.
    fn draws_random(&self, pass: &Pass) -> bool {
        let k = self.k;
        matches!(k.launch, Launch::Map { .. })
            && pass
                .elems
                .iter()
                .any(|&id| matches!(k.nodes[id].op, Op::Random(..)))
    }

    /// `vector_loop`'s loop, with indices of type `index`. A broadcast tensor's vector is the
    /// loop's place in its run (`jq<s>`: the quotient and remainder of `j` by the run's size),
    /// divided once and then carried from step to step (`fz_run_next`): divided at every step it
    /// cost W3 12 instructions a vector, carried 4.
    fn vector_steps(
        &mut self,
        pass: &Pass,
        start: &str,
        step: &str,
        domain: &[DimId],
        runs: &[(usize, Run)],
        index: &str,
    ) {
        let lanes = self.lanes;
        let wide = index == "long long";
        let unsigned = if wide { "unsigned long long" } else { index };
        let cast = |x: &str| match wide {
            true => x.to_string(),
            false => format!("({index})({x})"),
        };
        let mut advance = String::new();
        for (s, run) in runs {
            if run.repeat(domain).is_some() {
                self.helpers.insert("fz_run");
                self.line(format!(
                    "fz_run<{unsigned}> jq{s} = fz_run_of<{unsigned}>({start}, vr{s}, small);"
                ));
                self.line(format!(
                    "const fz_run<{unsigned}> jd{s} = fz_run_of<{unsigned}>({step}, vr{s}, small);"
                ));
                self.line(format!(
                    "const {unsigned} je{s} = ({unsigned})vr{s}.d - jd{s}.r;"
                ));
                let _ = write!(advance, ", jq{s} = fz_run_next(jq{s}, jd{s}, je{s})");
            }
        }
        // Slices over rows: the vector's row and its place in the row, carried as a broadcast's.
        if self.slices.iter().any(|(_, p)| p.pitch.is_some()) || self.addressed.is_some() {
            self.helpers.insert("fz_run");
            self.line(format!(
                "fz_run<{unsigned}> jqw = fz_run_of<{unsigned}>({start}, vw, small);"
            ));
            self.line(format!(
                "const fz_run<{unsigned}> jdw = fz_run_of<{unsigned}>({step}, vw, small);"
            ));
            self.line(format!("const {unsigned} jew = ({unsigned})vw.d - jdw.r;"));
            let _ = write!(advance, ", jqw = fz_run_next(jqw, jdw, jew)");
        }
        // An elementwise grid gives each thread one vector, so the loop runs once: unrolled,
        // ptxas computed its trip count with a 64-bit division in every thread. (Rolled, loops
        // that divide floats spilled around the division's slow path, so broadcasts only.)
        if matches!(self.k.launch, Launch::Map { .. }) && !advance.is_empty() {
            self.line("#pragma unroll 1");
        }
        self.open(format!(
            "for ({index} j = {}; j < {}; j += {}{advance})",
            cast(start),
            cast("nv"),
            cast(step)
        ));
        // The vector of each broadcast shape: `j` within the run it repeats (a suffix of the
        // domain's dims), or the run's number (a prefix: one element for all lanes).
        for (s, run) in runs {
            match run {
                Run::Whole => {}
                Run::Suffix(_) => self.line(format!("const {unsigned} jv{s} = jq{s}.r;")),
                Run::Prefix(_) => self.line(format!("const {unsigned} jv{s} = jq{s}.q;")),
                // The run's place, past the dims left out: one division a vector.
                Run::Middle { .. } => self.line(format!(
                    "const {unsigned} jv{s} = ({unsigned})(fz_divmod((unsigned long long)jq{s}.q, vm{s}, small).q * vr{s}.d) + jq{s}.r;"
                )),
            }
        }
        let uniform = self.vector_coordinates(domain);
        let k = self.k;
        let loaded: BTreeSet<usize> = pass
            .elems
            .iter()
            .filter(|id| !uniform.contains(id))
            .filter_map(|&id| match k.nodes[id].op {
                // Packed bits are read a word at a time (`fz_bit`).
                Op::Load(p) if !k.params[p].packed => Some(p),
                _ => None,
            })
            .collect();
        // One tensor loaded in vectors a step (a packed mask's word may be read beside it),
        // nothing gathered: no second vector for ptxas to sink below the first values' math,
        // so values that arithmetic computed round without a NaN test (`vector_bits`), as
        // from registers. S3's bf16 softplus, its NaN a canonical one: 89 -> 94% (item 149).
        let single = loaded.len() == 1
            && pass
                .elems
                .iter()
                .all(|&id| !matches!(k.nodes[id].op, Op::View(..)));
        // A loop that writes asks L2 to evict the lines it reads last (`fz_ld_keep`), so that
        // the lines it writes leave first: W1 1.5 points faster on the H200, W2 0.8. A loop that
        // only reads (a full reduction's) lost 15 points with it (NOTES item 53). A loop that
        // draws random numbers is bound by its instructions: it gains nothing from it, and the
        // policy took W3 6 instructions a vector (NOTES item 61).
        let keep = !pass.writes.is_empty() && !self.draws_random(pass);
        if keep {
            self.helpers.insert("fz_keep");
        }
        let load = |at: String| match keep {
            true => format!("fz_ld_keep({at})"),
            false => format!("*({at})"),
        };
        for &p in &loaded {
            let (t, name) = self.param_text(p);
            let shape = k.params[p].shape.as_ref().expect("a tensor");
            let s = self.shape_index(shape);
            let run = runs.iter().find(|(r, _)| *r == s).map(|(_, run)| *run);
            let vectors = format!("reinterpret_cast<const fz_vec<{t}, {lanes}>*>(p_{name})");
            match run.expect("every loaded shape has a run") {
                Run::Whole => self.line(format!(
                    "const fz_vec<{t}, {lanes}> l_{name} = {};",
                    load(format!("{vectors} + j"))
                )),
                Run::Suffix(_) | Run::Middle { .. } => self.line(format!(
                    "const fz_vec<{t}, {lanes}> l_{name} = {};",
                    load(format!("{vectors} + jv{s}"))
                )),
                Run::Prefix(_) => {
                    self.line(format!("fz_vec<{t}, {lanes}> l_{name};"));
                    let all: Vec<String> = (0..lanes).map(|l| format!("l_{name}.v[{l}]")).collect();
                    self.line(format!("{} = p_{name}[jv{s}];", all.join(" = ")));
                }
            }
        }
        self.slice_vectors(&load);
        self.addressed_vectors(&load);
        for &o in &pass.writes {
            self.line(format!("fz_vec<{}, {lanes}> s{o};", self.vector_type(o)));
        }
        // One Philox block gives the four words of four neighbouring positions (lanes is 4 or 8).
        for &id in &pass.elems {
            if let Op::Random(_, seed, site) = k.nodes[id].op {
                let blocks = self.lanes / 4;
                self.line(format!("fz_u4 rq{id}[{blocks}];"));
                for b in 0..blocks {
                    self.line(format!("rq{id}[{b}] = fz_philox(rk{seed}, (unsigned long long)j * {blocks} + {b}, {site}u);"));
                }
            }
        }
        // The lanes written out rather than `#pragma unroll`ed: the loop form made ptxas spill.
        for lane in 0..lanes {
            self.open("");
            self.line(format!("const int l = {lane};"));
            let lanes_values: Vec<NodeId> = pass
                .elems
                .iter()
                .copied()
                .filter(|id| !uniform.contains(id))
                .collect();
            self.values(&lanes_values, Scope::Lane);
            self.accumulate(&pass.reduces);
            for &o in &pass.writes {
                let v = self.vector_element(o);
                self.line(format!("s{o}.v[l] = {v};"));
            }
            self.close();
        }
        for &o in &pass.writes {
            let t = k.outputs[o].elem.c_storage();
            if k.outputs[o].packed {
                // The vector's bits, in the word of its first element.
                self.helpers.insert("fz_bits");
                let bits: Vec<String> = (0..lanes)
                    .map(|l| format!("(s{o}.v[{l}] ? {}u : 0u)", 1u32 << l))
                    .collect();
                self.line(format!(
                    "fz_or_bits(out{o}, (long long)j * {lanes}, {});",
                    bits.join(" | ")
                ));
                continue;
            }
            let bits = self.vector_bits(o, single);
            let Some(place) = &k.outputs[o].place else {
                self.line(format!(
                    "reinterpret_cast<fz_vec<{t}, {lanes}>*>(out{o})[j] = {bits};"
                ));
                continue;
            };
            // At the place of the vector's first element; nowhere where it scatters from
            // outside the gathered dim. A vector rounded whole is rounded before the test:
            // rounded in the store under it, ptxas moved the loads of its values below the load
            // and test of the index (V4, when copies were rounded so, at 63% of copy speed on
            // an H200, from 82%).
            let coord = |d| self.layout.coord(d);
            let (at, inside) =
                self.layout
                    .view_access(&place.view, &k.outputs[o].shape, coord, &SYNTAX);
            let bits = match self.rounds_vectors(o) {
                true => {
                    self.line(format!("const fz_vec<{t}, {lanes}> b{o} = {bits};"));
                    format!("b{o}")
                }
                false => bits,
            };
            let store =
                format!("*reinterpret_cast<fz_vec<{t}, {lanes}>*>(out{o} + ({at})) = {bits};");
            match inside {
                Some(inside) => self.line(format!("if ({inside}) {store}")),
                None => self.line(store),
            }
        }
        self.close();
    }

    /// In a vector loop that loads and stores by address, the coordinates of the vector's first
    /// element (its row's, split as the scalar loop splits `i`, and its place in the row) and
    /// the values each vector computes once, before its lanes; returns those values.
    fn vector_coordinates(&mut self, domain: &[DimId]) -> Vec<NodeId> {
        let Some((_, uniform)) = self.addressed.clone() else {
            return vec![];
        };
        let (rows, last) = domain.split_at(domain.len() - 1);
        self.line(format!(
            "const long long {} = (long long)jqw.r * {};",
            self.layout.coord(last[0]),
            self.lanes
        ));
        for l in self.layout.split("(long long)jqw.q", rows, &SYNTAX) {
            self.line(l);
        }
        let k = self.k;
        let shapes: BTreeSet<usize> = uniform
            .iter()
            .filter_map(|&id| match k.nodes[id].op {
                Op::Load(p) => {
                    Some(self.shape_index(k.params[p].shape.as_ref().expect("a tensor")))
                }
                _ => None,
            })
            .collect();
        let all = self.layout.shapes();
        for s in shapes {
            let offset = self.layout.offset(&all[s], None);
            self.line(format!("const long long o{s} = {offset};"));
        }
        self.values(&uniform, Scope::Element);
        uniform
    }
}

impl Cuda<'_> {
    /// The conditions under which the slices of a pass line up with the vectors: rows of whole
    /// vectors, each starting at a multiple of the lanes.
    fn slices_aligned(&self, domain: &[DimId], views: &[(NodeId, Option<Pitch>)]) -> Vec<String> {
        let lanes = self.lanes;
        let mut aligned = vec![];
        for (_, pitch) in views {
            let Some(p) = pitch else { continue };
            if let Some(pitch) = &p.pitch {
                let last = self.layout.size(domain[domain.len() - 1]);
                aligned.push(format!("{} % {lanes} == 0", wrapped(&last)));
                aligned.push(format!(
                    "{} % {lanes} == 0",
                    wrapped(&self.layout.linear(pitch))
                ));
            }
            if !p.offset.is_empty() {
                let offset = wrapped(&self.layout.linear(&p.offset));
                aligned.push(format!("{offset} % {lanes} == 0"));
            }
        }
        aligned
    }

    /// The conditions under which the accesses a vector loop makes by address line up with the
    /// vectors: the domain's rows whole vectors, and each access's offset and strides (a
    /// gather's too) multiples of the lanes.
    fn addresses_aligned(&self, pass: &Pass, domain: &[DimId], views: &[NodeId]) -> Vec<String> {
        let lanes = self.lanes;
        let last = self.layout.size(domain[domain.len() - 1]);
        let mut aligned = vec![format!("{} % {lanes} == 0", wrapped(&last))];
        for (view, _) in crate::plan::rows::address_views(self.k, pass, views) {
            let strides = view.strides[..view.strides.len() - 1]
                .iter()
                .chain(view.gathers.iter().map(|g| &g.stride))
                .chain(std::iter::once(&view.offset));
            for linear in strides.filter(|l| !l.is_empty()) {
                aligned.push(format!(
                    "{} % {lanes} == 0",
                    wrapped(&self.layout.linear(linear))
                ));
            }
        }
        aligned
    }

    /// Each slice loaded by address, `l_w<id>`: the vector at its first lane's element, or
    /// zeros where its index is outside the gathered dim.
    fn addressed_vectors(&mut self, load: &dyn Fn(String) -> String) {
        let Some((views, _)) = self.addressed.clone() else {
            return;
        };
        let lanes = self.lanes;
        for id in views {
            let Op::View(param, view) = &self.k.nodes[id].op else {
                unreachable!("a slice is a view")
            };
            let (t, name) = self.param_text(*param);
            let coord = |d| self.layout.coord(d);
            let (at, inside) =
                self.layout
                    .view_access(view, &self.k.nodes[id].shape, coord, &SYNTAX);
            let vector = load(format!(
                "reinterpret_cast<const fz_vec<{t}, {lanes}>*>(p_{name} + ({at}))"
            ));
            match inside {
                Some(inside) => {
                    self.line(format!("fz_vec<{t}, {lanes}> l_w{id} = {{}};"));
                    self.line(format!("if ({inside}) l_w{id} = {vector};"));
                }
                None => self.line(format!("const fz_vec<{t}, {lanes}> l_w{id} = {vector};")),
            }
        }
    }

    /// Each slice's vector, `l_w<id>`: at its row's start (`jqw.q` rows of `pitch`), plus the
    /// vector's place in the row, plus its offset, all in vectors.
    fn slice_vectors(&mut self, load: &dyn Fn(String) -> String) {
        let lanes = self.lanes;
        for (id, p) in self.slices.clone() {
            let Op::View(param, _) = self.k.nodes[id].op else {
                unreachable!("a slice is a view")
            };
            let (t, name) = self.param_text(param);
            let mut at = match &p.pitch {
                Some(pitch) => format!(
                    "(long long)jqw.q * ({} / {lanes}) + jqw.r",
                    wrapped(&self.layout.linear(pitch))
                ),
                None => "j".to_string(),
            };
            if !p.offset.is_empty() {
                let offset = wrapped(&self.layout.linear(&p.offset));
                at = format!("{at} + {offset} / {lanes}");
            }
            let vectors = format!("reinterpret_cast<const fz_vec<{t}, {lanes}>*>(p_{name})");
            self.line(format!(
                "const fz_vec<{t}, {lanes}> l_w{id} = {};",
                load(format!("{vectors} + ({at})"))
            ));
        }
    }
}

/// `text` in parentheses, unless it is a name or already in a pair of its own.
fn wrapped(text: &str) -> String {
    let whole = text.starts_with('(')
        && text.ends_with(')')
        && text[1..text.len() - 1]
            .chars()
            .try_fold(0i32, |depth, c| match c {
                '(' => Some(depth + 1),
                ')' if depth == 0 => None,
                ')' => Some(depth - 1),
                _ => Some(depth),
            })
            .is_some();
    match whole || !text.contains(' ') {
        true => text.to_string(),
        false => format!("({text})"),
    }
}
