"""Everything that writes the graph: chunking, extraction, embedding orchestration, graph updates."""
