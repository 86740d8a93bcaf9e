"""Text: plain-text files and incremental decoding (``io``), chapter headings (``chapters``), and cutting
text into sentence-bounded passages with their place (``passages``). No torch."""
