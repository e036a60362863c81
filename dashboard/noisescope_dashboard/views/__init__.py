"""The dashboard's pages: Streamlit scripts that ``app.py`` registers with ``st.navigation``."""
