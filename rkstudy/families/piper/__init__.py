"""The Piper (VITS) voice the Piper families share: the real voice from PyPI, its text front end and
its seams (voice.py, host), and the latent files a host hands to a board (latents.py, board side).

Not a family of its own: piper_decoder, piper_encoder and inflect_decoder build on it.
"""
