package bus
