"""Dynamic knowledge-graph expansion at query time (``mode="expand"``).

A small query subgraph is grown from graph mode's seeds (question entities linked to the graph,
facts similar to the question). Each iteration expands the frontier: every frontier entity pulls
its stored facts most similar to the question, the first iteration also takes the best facts of
a fact search, and with an LLM the model proposes facts read from the best passages. Every
candidate is checked against passages before it joins (refinement): a stored fact against its
source passages, a proposed one against passages that mention both of its ends (embedding
support, then the model's entailment verdict); the rest are dropped with the reason in the
trace. Expansion stops at ``max_iterations`` or ``max_entities`` (:class:`ExpandConfig`).

Passages: the question's graph ranking is fused by reciprocal rank with the graph rankings of
path queries, the question followed by a verified fact that leads from a question entity to a new
one (the bridge the question is after); each hit's ``why`` names the subgraph facts the passage
supports.

Expansion only reads. The verified new facts (proposed by the LLM, not stored yet) come back in
:attr:`Expansion.new_facts`; ``HipGraph.expand(..., persist=True)`` hands them to the indexer,
which writes them in one transaction with their supporting passages as provenance.

Modules: :mod:`.results` (what a run returns), :mod:`.state` (typed inputs, per-run state),
:mod:`.llm` (the model's steps and reply parsers), :mod:`.search` (:class:`Expander`).
"""

from hipgraph.query.expand.llm import parse_facts, parse_verdict
from hipgraph.query.expand.results import (
    GRAPH,
    LLM,
    RETRIEVAL,
    Expansion,
    SubgraphEntity,
    SubgraphFact,
)
from hipgraph.query.expand.search import Expander

__all__ = ["GRAPH", "LLM", "RETRIEVAL", "Expander", "Expansion", "SubgraphEntity",
           "SubgraphFact", "parse_facts", "parse_verdict"]
