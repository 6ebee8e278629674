"""The objective league: every recipe continued from one base masked LM for the same training
FLOPs, over seeds, scored on retrieval and zero-shot transfer (docs/league.md).

`python -m xlm_jax.league` runs it (`__main__`); `runner` holds the base, the cells and the
shipped base; `plan` reads the league's settings and sizes each cell by its FLOPs; `score`
scores one model; `results` writes league.json, league.md and league.png and tests the papers'
claims; `xlme_generator` builds XLM-E's generator from the base."""
