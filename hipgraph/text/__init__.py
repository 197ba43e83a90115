"""Vocabulary shared by the write side (:mod:`hipgraph.indexers`) and the read side
(:mod:`hipgraph.query`, :mod:`hipgraph.generation`, the evaluators): the normalization that
entity and fact keys merge on, the text a fact is embedded as, the stored record format of
conversation memory units, lenient parsing of LLM JSON replies, spaCy pipeline loading and
UTF-8/JSON file reading. It depends on nothing but :mod:`hipgraph.errors` and the standard
library, so either side can use it without importing the other.
"""
