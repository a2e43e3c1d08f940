"""The ground floor every other package stands on: a run's context and record, tensors and
their names, memory, progress, quiet converter output, work folders. Nothing here imports a
framework or any other compressor package but errors."""
