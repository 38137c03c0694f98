// placeholder: tests land here
