"""A real X client for the computer tests: a Tk window of a known colour that records input.

Usage: python xwindow.py <record-file>. Writes ``ready <window id>`` to the record file once the
window is mapped, then one line per event: ``click <x_root> <y_root> <button>`` and
``key <keysym>``.
"""

import sys
import tkinter

TITLE = "toolhost-test-window"
COLOUR = "#3366cc"
GEOMETRY = (320, 200, 100, 80)  # width, height, x, y

record = open(sys.argv[1], "a", buffering=1)  # noqa: SIM115 - lives as long as the window
root = tkinter.Tk()
root.title(TITLE)
w, h, x, y = GEOMETRY
root.geometry(f"{w}x{h}+{x}+{y}")
root.configure(background=COLOUR, highlightthickness=0, borderwidth=0)
root.bind("<Button>", lambda e: record.write(f"click {e.x_root} {e.y_root} {e.num}\n"))
root.bind("<Key>", lambda e: record.write(f"key {e.keysym}\n"))


def announce() -> None:
    root.update_idletasks()
    root.focus_force()
    record.write(f"ready {int(root.wm_frame(), 16)}\n")


root.after(50, announce)
root.mainloop()
