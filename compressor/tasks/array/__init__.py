"""The array task: classifiers, regressors and encoders fed arrays, scored by accuracy,
fidelity, mse or a custom metric."""
