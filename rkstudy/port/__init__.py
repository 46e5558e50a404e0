"""The generic port path: a user's own vocoder ONNX through the project's plan / step / build / gate path."""
