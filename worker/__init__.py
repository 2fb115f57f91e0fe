"""sparseps worker package: the client that talks to the servers, data readers, models and the training loop."""
