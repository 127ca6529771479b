"""The data the model learns from: temperature-map data sets and their files
(datasets.py, npzfile.py), mirror augmentation, and the synthetic lounge generator."""
