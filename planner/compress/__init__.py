"""Compression planners: what another plan swaps or stashes is kept encoded (on the copy
engine, on the GPU, lossless or lossy) where that pays."""
