"""`g4bench report`: one self-contained HTML page over run folders (views.py reads, page.py renders)."""
