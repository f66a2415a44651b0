"""Run the Fractalic ``command: python`` worker: ``python -m sidecars.fractalic_python``."""

from sidecars.fractalic_python import main

if __name__ == "__main__":
    main()
