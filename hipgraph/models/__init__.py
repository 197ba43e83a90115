"""Model backends (embedders, chat clients) behind small protocols."""
