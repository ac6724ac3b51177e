"""Recall: ranking, the per-channel indexes (FAISS and BM25), and the reading of time
phrases.
"""
