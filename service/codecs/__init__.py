"""Bytes <-> arrays and tensors: JSON tensors, base64, images in, binary formats and PNGs out."""
