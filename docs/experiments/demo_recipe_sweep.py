"""Demo-recipe sweep: MMLM+TLM on the demo corpus with in-memory batches, retrieval on the way.

Why: to find out, faster than `python -m xlm_jax.demo`, which model size / optimiser / masking
settings make Tatoeba retrieval on the demo held-out split rise above the untrained model.
It uses the library's own Transformer, MaskedLM objective, train step, optimiser and retrieval
evaluation; only the input side differs from the trainer: the demo files are read and
tokenized once into memory (alpha-smoothed language sampling, greedy packing), no seqio.
The results are in docs/NOTES.md. Example (run from the repository root):

    python docs/experiments/demo_recipe_sweep.py --steps 3000 --eval_every 1000 --ln pre \
        --lr 5e-3 --dropout 0 --warmup 200 --layers 2 --hidden 64 --mlp 256 --bs 64

`--xlco_w W` adds an in-batch contrastive loss on translation pairs (an upper bound for what
a sentence-level signal such as InfoXLM's XLCo does here; it is not MMLM+TLM).
`--save FILE` pickles (config, params) at the end for offline analysis.
"""
import argparse, os, pickle, shutil, sys, tempfile, time
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
import numpy as np
import jax
import jax.numpy as jnp
from xlm_jax.objectives.base import LossOutput, Metric, Objective
from xlm_jax.models.config import get_config
from xlm_jax.models.transformer import Transformer
from xlm_jax.objectives.mlm import MaskedLM
from xlm_jax.train import step as T, optim
from xlm_jax.data.vocab import XLMRTokenizer
from xlm_jax.data import sampling, sources
from xlm_jax.encoder import Encoder
from xlm_jax.evaluation import retrieval

D = os.path.join(ROOT, "tasks", "demo_data")
p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=1000)
p.add_argument("--bs", type=int, default=32)
p.add_argument("--seq", type=int, default=64)
p.add_argument("--layers", type=int, default=4)
p.add_argument("--hidden", type=int, default=128)
p.add_argument("--mlp", type=int, default=512)
p.add_argument("--heads", type=int, default=4)
p.add_argument("--lr", type=float, default=1e-3)
p.add_argument("--warmup", type=int, default=50)
p.add_argument("--dropout", type=float, default=0.1)
p.add_argument("--mono_w", type=float, default=1.0)
p.add_argument("--tlm_w", type=float, default=1.0)
p.add_argument("--mask", type=float, default=0.15)
p.add_argument("--reset_pos", type=int, default=0)
p.add_argument("--alpha", type=float, default=0.3)
p.add_argument("--eval_every", type=int, default=250, help="0: no retrieval evaluation")
p.add_argument("--ln", default="post")
p.add_argument("--pack", type=int, default=1)
p.add_argument("--schedule", default="linear")
p.add_argument("--langs", default="", help="comma-separated Tatoeba languages (default all)")
p.add_argument("--train_langs", default="", help="'tatoeba': train only on English and the "
               "Tatoeba languages; or a comma-separated list (default: every demo language)")
p.add_argument("--xlco_w", type=float, default=0.0,
               help="> 0: add an in-batch contrastive loss on translation pairs (upper bound, not MMLM+TLM)")
p.add_argument("--xlco_layer", type=int, default=-1, help="layer pooled for --xlco_w (-1: last)")
p.add_argument("--xlco_tau", type=float, default=0.1)
p.add_argument("--xlco_lib", type=int, default=0,
               help="1: --xlco_w uses the library's XLCo (momentum encoder + queue) instead")
p.add_argument("--xlco_m", type=float, default=0.999)
p.add_argument("--xlco_q", type=int, default=1024)
p.add_argument("--xlco_pool", default="cls")
p.add_argument("--xlco_norm", type=int, default=0)
p.add_argument("--xlco_inbatch", type=int, default=0)
p.add_argument("--proj", type=int, default=0, help="projection_dim of the XLCo objective's head")
p.add_argument("--save", default="")
a = p.parse_args()
print(vars(a), flush=True)

tok = XLMRTokenizer(os.path.join(D, "spm.model"))
BOS, EOS, PAD = tok.bos_id, tok.eos_id, tok.pad_id
langs = sources.languages_in_dir(D + "/mono")
pairs = [x for x in sources.pairs_in_dir(D + "/parallel") if x.startswith("en-")]
if a.train_langs:
    keep = set(a.train_langs.split(",") if a.train_langs != "tatoeba"
               else [f.split(".")[1].split("-")[0] for f in os.listdir(D + "/tatoeba")]) | {"en"}
    langs = [l for l in langs if l in keep]
    pairs = [x for x in pairs if x.split("-")[1] in keep]

# The library's readers: blank lines (document breaks) and invalid UTF-8 are skipped as in seqio.
mono = {l: [tok.encode(x)[: a.seq - 2]
            for doc in sources.iter_documents(sources.find_monolingual_file(D + "/mono", l))
            for x in doc]
        for l in langs}
par = {}
for pr in pairs:
    xx = pr.split("-")[1]
    files = sources.find_parallel_files(D + "/parallel", "en", xx)
    par[xx] = [(tok.encode(e), tok.encode(t)) for e, t in sources.iter_pairs(files)]

rs = np.random.RandomState(0)
mono_rates = sampling.smoothed_rates({l: len(v) for l, v in mono.items()}, a.alpha)
par_rates = sampling.smoothed_rates({l: len(v) for l, v in par.items()}, a.alpha)
mono_l, mono_p = list(mono_rates), list(mono_rates.values())
par_l, par_p = list(par_rates), list(par_rates.values())

def pack(gen, bs, seq):
    ids = np.full((bs, seq), PAD, np.int32); seg = np.zeros((bs, seq), np.int32)
    pos = np.zeros((bs, seq), np.int32)
    for r in range(bs):
        t, s = 0, 1
        while True:
            ex, ps = gen()
            if len(ex) > seq: ex, ps = ex[:seq], ps[:seq]
            if t + len(ex) > seq: break
            ids[r, t:t+len(ex)] = ex; seg[r, t:t+len(ex)] = s; pos[r, t:t+len(ex)] = ps
            t += len(ex); s += 1
            if not a.pack: break
    return {"input_ids": ids, "segment_ids": seg, "positions": pos}

def gen_mono():
    l = mono_l[rs.choice(len(mono_l), p=mono_p)]
    x = mono[l][rs.randint(len(mono[l]))]
    ex = [BOS] + x + [EOS]
    return ex, list(range(len(ex)))

def gen_pair():
    l = par_l[rs.choice(len(par_l), p=par_p)]
    e, t = par[l][rs.randint(len(par[l]))]
    if rs.rand() < 0.5:
        A, B = e, t
    else:
        A, B = t, e
    s1 = [BOS] + A + [EOS]; s2 = [EOS] + B + [EOS]
    if a.reset_pos:
        s2 = [BOS] + B + [EOS]
        ps = list(range(len(s1))) + list(range(len(s2)))
    else:
        ps = list(range(len(s1) + len(s2)))
    return s1 + s2, ps

cfg = get_config("tiny", vocab_size=tok.vocab_size, num_layers=a.layers, hidden_size=a.hidden,
                 mlp_dim=a.mlp, num_heads=a.heads, dropout_rate=a.dropout,
                 ln_style=a.ln)
net = Transformer(cfg)
objs = [T.WeightedObjective(MaskedLM(net, "mmlm", "mono", a.mask, int(np.ceil(a.mask * a.seq)) + 2), a.mono_w),
        T.WeightedObjective(MaskedLM(net, "tlm", "pair", a.mask, int(np.ceil(a.mask * a.seq)) + 2), a.tlm_w)]

class PairContrast(Objective):
    """In-batch InfoNCE between mean-pooled sides of translation pairs (no queue, no momentum):
    an upper bound on what a sentence-level cross-lingual signal does to retrieval here."""
    name, kind = "xlco", "split_pair"

    def prepare(self, batch, rng):
        return batch

    def counts(self, prepared):  # one term, "loss": both directions of every pair
        return {"loss": jnp.asarray(2.0 * prepared["src_ids"].shape[0])}

    def loss(self, params, prepared, rng, state, deterministic=False):
        def pooled(mdl, ids):
            out = mdl.encode(ids, deterministic=deterministic, return_hidden_states=True)
            h = out.hidden_states[a.xlco_layer]
            w = (ids != PAD).astype(h.dtype)[..., None]
            v = (h * w).sum(1) / w.sum(1)
            return v / jnp.linalg.norm(v, axis=-1, keepdims=True)
        enc = self.encoder_params(params)
        s = net.apply({"params": enc}, prepared["src_ids"], method=pooled, rngs={"dropout": rng})
        t = net.apply({"params": enc}, prepared["tgt_ids"], method=pooled, rngs={"dropout": rng})
        logits = s @ t.T / a.xlco_tau
        lab = jnp.arange(s.shape[0])
        l1 = -jnp.take_along_axis(jax.nn.log_softmax(logits, -1), lab[:, None], -1).sum()
        l2 = -jnp.take_along_axis(jax.nn.log_softmax(logits.T, -1), lab[:, None], -1).sum()
        acc = (jnp.argmax(logits, -1) == lab).sum() + (jnp.argmax(logits.T, -1) == lab).sum()
        return LossOutput(losses={"loss": l1 + l2},
                          metrics={"accuracy": Metric(acc.astype(jnp.float32), 2.0 * s.shape[0])})

def pair_batch(bs, seq):
    src = np.full((bs, seq), PAD, np.int32); tgt = np.full((bs, seq), PAD, np.int32)
    for r in range(bs):
        l = par_l[rs.choice(len(par_l), p=par_p)]
        e, t = par[l][rs.randint(len(par[l]))]
        for arr, x in ((src, e), (tgt, t)):
            x = [BOS] + x[: seq - 2] + [EOS]
            arr[r, :len(x)] = x
    return {"src_ids": src, "tgt_ids": tgt}

if a.xlco_w > 0 and a.xlco_lib:
    from xlm_jax.objectives.xlco import XLCo
    objs.append(T.WeightedObjective(XLCo(
        net, name="xlco", kind="split_pair", layer=None if a.xlco_layer < 0 else a.xlco_layer,
        temperature=a.xlco_tau, queue_size=a.xlco_q, momentum=a.xlco_m, mask_prob=a.mask,
        max_predictions=int(np.ceil(a.mask * (a.seq // 2))) + 2, pooling=a.xlco_pool,
        normalize=bool(a.xlco_norm), in_batch_negatives=bool(a.xlco_inbatch),
        projection_dim=a.proj), a.xlco_w))
elif a.xlco_w > 0:
    objs.append(T.WeightedObjective(PairContrast(), a.xlco_w))
ocfg = optim.OptimizerConfig(learning_rate=a.lr, schedule=a.schedule, warmup_steps=a.warmup,
                             total_steps=a.steps, weight_decay=0.01, clip_norm=1.0)
tx = optim.make_optimizer(ocfg); sched = optim.make_schedule(ocfg)
init = T.make_init_fn(net, objs, tx, a.seq)
import flax.linen as nn
state = jax.jit(lambda r: nn.meta.unbox(init(r)))(jax.random.PRNGKey(0))
step = jax.jit(T.make_train_step(objs, tx, sched, 1), donate_argnums=(0,))

edir = tempfile.mkdtemp(prefix="demo_sweep_")
shutil.copy(D + "/spm.model", edir + "/spm.model")
EVAL_LANGS = a.langs.split(",") if a.langs else None

def evaluate(params, tag):
    t0 = time.time()
    enc = Encoder(config=cfg, params=params["encoder"], path=edir)
    res = retrieval.evaluate(enc, D + "/tatoeba", layers="all", languages=EVAL_LANGS)
    pl = res.per_layer
    print(f"[{tag}] retrieval per layer: " + " ".join(f"{k}:{100*v:.1f}" for k, v in pl.items())
          + f"  ({time.time()-t0:.0f}s)", flush=True)
    return pl

if a.eval_every: evaluate(state.params, "step 0")
rng = jax.random.PRNGKey(1)
t0 = time.time(); tw = time.time()
for i in range(1, a.steps + 1):
    batches = {"mmlm": pack(gen_mono, a.bs, a.seq), "tlm": pack(gen_pair, a.bs, a.seq)}
    if a.xlco_w > 0:
        batches["xlco"] = pair_batch(a.bs, a.seq // 2)
        if a.xlco_lib:  # a sentence and its translation, either side first
            src, tgt = batches["xlco"]["src_ids"], batches["xlco"]["tgt_ids"]
            flip = rs.rand(a.bs) < 0.5
            batches["xlco"] = {"x_input_ids": np.where(flip[:, None], tgt, src),
                               "y_input_ids": np.where(flip[:, None], src, tgt)}
    state, m = step(state, batches, rng)
    if i % 50 == 0:
        m = jax.device_get(m)
        print(f"step {i} mmlm {m['mmlm/loss']:.3f} acc {m['mmlm/accuracy']:.3f} tlm {m['tlm/loss']:.3f} "
              f"acc {m['tlm/accuracy']:.3f}"
              + (f" xlco {m['xlco/loss']:.3f} acc {m['xlco/accuracy']:.3f}" if a.xlco_w > 0 else "")
              + f"  {(time.time()-tw)/50:.3f}s/step", flush=True)
        tw = time.time()
    if a.eval_every and (i % a.eval_every == 0 or i == a.steps):
        evaluate(state.params, f"step {i}, {time.time()-t0:.0f}s")
        tw = time.time()
if a.save:
    with open(a.save, "wb") as f:
        pickle.dump((cfg, jax.device_get(state.params["encoder"])), f)
