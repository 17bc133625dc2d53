"""Models beyond the seed's softmax: the packaged MLP and CNN, and a user's
factory, each a function of (input shape, class count) returning a Keras
model. `model.create_model` picks one by `config.model`."""
