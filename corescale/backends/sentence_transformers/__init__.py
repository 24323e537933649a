"""sentence-transformers as its users call it: SentenceTransformer.encode(texts), CrossEncoder.predict(pairs)."""
