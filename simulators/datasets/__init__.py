"""Dataset loaders: built-in public datasets, synthetic streams and csv/libsvm files."""
