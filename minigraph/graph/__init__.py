"""Define-and-run: graphs, the reverse-graph pass, graph passes, compile and trace."""
