DROP TABLE IF EXISTS delayd_namespace_born;
