"""The expert runtime and the application object; imports the port, never a backend."""
