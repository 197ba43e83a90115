"""Everything that reads the graph: retrieval modes and graph statistics."""
