"""The engine: channels and their live views, the one write path (changes), the store
pipeline, recall's effects, dreams, and the registry of channels.
"""
